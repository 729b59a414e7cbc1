#pragma once
// Output files that become visible all at once, or not at all (issue 7: a failed or killed job
// leaves no output that looks complete).
//
// stage() writes every file under a hidden temporary name, DIR/.NAME.npy.partial: rank 0 creates
// each file at its full size, then every rank writes its own positions (or rank 0 writes a
// whole tensor). commit() renames them all to DIR/NAME.npy, on rank 0, once the caller has
// finished everything else (the report and trace included). Until then a failure, an exception
// or SIGTERM/SIGINT/SIGHUP (what Open MPI sends when another rank dies) removes the temporary
// files, on every rank. Every step is agreed, so no rank is left waiting in a collective.
#include <span>
#include <string>
#include <vector>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/layout.hpp"
#include "ringattn/core/shape.hpp"

namespace ringattn::runtime {

template <class T>
class StagedOutputs {
 public:
  struct File {
    std::string name;               // "o" becomes o.npy
    std::vector<core::Index> shape;
    int pos_axis;                   // the positions' axis: every rank writes its own positions of
                                    // `data`; kWhole: `data` is the whole tensor, rank 0 writes it
    std::span<const T> data;
  };
  static constexpr int kWhole = -1;

  StagedOutputs(const comm::Comm& comm, std::string dir, core::DType dtype, const core::Layout& layout)
      : comm_(comm), dir_(std::move(dir)), dtype_(dtype), layout_(layout) {}
  StagedOutputs(const StagedOutputs&) = delete;
  StagedOutputs& operator=(const StagedOutputs&) = delete;
  ~StagedOutputs() { discard(); }

  void stage(std::vector<File> files);  // throws AgreedFailure on every rank if any rank fails
  void commit();                        // idem; after it the files are in place
  void discard();                       // removes what is still staged; never throws

 private:
  std::string temporary(const File& f) const;

  const comm::Comm& comm_;
  std::string dir_;
  core::DType dtype_;
  const core::Layout& layout_;
  std::vector<File> files_;
  std::vector<std::string> committed_;  // rank 0: final paths renamed so far by commit()
  bool staged_ = false;
};

}  // namespace ringattn::runtime
