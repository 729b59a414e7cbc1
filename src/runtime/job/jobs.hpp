#pragma once
// The job modes `run` drives through the harness (private to src/runtime).
#include <memory>
#include <vector>

#include "ringattn/comm/comm.hpp"
#include "ringattn/runtime/harness.hpp"
#include "ringattn/runtime/job_config.hpp"
#include "ringattn/runtime/run_job.hpp"

namespace ringattn::runtime {

// Attention over the strategy: q, k, v, dout in; o, lse, dq, dk, dv out.
template <class S>
std::unique_ptr<Job> make_attention_job(const comm::Comm& comm, const JobConfig& c, const JobPlan& p);

// The whole layer: x, the weights and dy in; y, dx and the weight gradients out.
class LayerJobBase : public Job {
 public:
  // Rank 0, after finish_report: one entry per rank.
  virtual const std::vector<LayerRankFigures>& figures() const = 0;
};
template <class S>
std::unique_ptr<LayerJobBase> make_layer_job(const comm::Comm& comm, const JobConfig& c, const JobPlan& p);

// The output-file dtype of an accumulation type.
template <class A>
constexpr core::DType file_dtype() {
  return sizeof(A) == 8 ? core::DType::f64 : core::DType::f32;
}

// An OutputTensor viewing `data`.
template <class T>
OutputTensor output(std::string name, std::vector<Index> shape, int pos_axis, const std::vector<T>& data,
                    bool checked) {
  OutputTensor t;
  t.name = std::move(name);
  t.shape = std::move(shape);
  t.pos_axis = pos_axis;
  if constexpr (sizeof(T) == 8) t.f64 = data;
  else t.f32 = data;
  t.file_dtype = file_dtype<T>();
  t.checked = checked;
  return t;
}

}  // namespace ringattn::runtime
