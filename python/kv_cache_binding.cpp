// ringattn._ringattn.KVCache: the binding of runtime::KVCacheShard (ringattn/runtime/kv_cache.hpp),
// one object per attention layer. Tensors pass as raw pointers to CPU memory that
// python/ringattn/__init__.py keeps alive and sizes. MPI and the compute run without the GIL.
#include <mpi4py/mpi4py.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <memory>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "ringattn/comm/comm.hpp"
#include "ringattn/core/storage.hpp"
#include "ringattn/runtime/agreement.hpp"
#include "ringattn/runtime/kv_cache.hpp"

namespace py = pybind11;
using ringattn::core::Index;

namespace {

// The storage pointer and the accumulation pointer a shard C (a unique_ptr to KVCacheShard<S>) takes.
template <class C>
const typename C::element_type::Storage* ptr(const C&, std::uintptr_t p) {
  return reinterpret_cast<const typename C::element_type::Storage*>(p);
}
template <class C>
typename C::element_type::A* out(const C&, std::uintptr_t p) {
  return reinterpret_cast<typename C::element_type::A*>(p);
}

class KVCache {
 public:
  KVCache(py::object comm, Index batch, Index heads, Index kv_heads, Index head_dim, std::string dtype,
          std::string layout, std::optional<Index> window, std::optional<double> scale, std::optional<Index> capacity,
          std::optional<double> timeout, std::string merge) {
    MPI_Comm* handle = PyMPIComm_Get(comm.ptr());
    if (!handle) throw py::error_already_set();
    const MPI_Comm mpi = *handle;
    py::gil_scoped_release unlocked;
    comm_ = std::make_unique<ringattn::comm::Comm>(ringattn::comm::Comm::duplicate_of(&mpi));
    ringattn::runtime::KVCacheOptions o;
    o.batch = batch;
    o.heads = heads;
    o.kv_heads = kv_heads;
    o.head_dim = head_dim;
    o.dtype = dtype;
    o.layout = layout;
    o.window = window;
    o.scale = scale;
    o.capacity = capacity;
    o.timeout_s = timeout;
    o.merge = merge;
    const auto& names = ringattn::runtime::python_cache_names();
    ringattn::core::DType t = ringattn::core::DType::f32;
    ringattn::runtime::agreed(*comm_, [&] { t = ringattn::runtime::parse_dtype(dtype, names); });
    ringattn::core::with_storage(t, [&]<class S>() {
      std::unique_ptr<ringattn::runtime::KVCacheShard<S>> c;
      ringattn::runtime::agreed(*comm_, [&] {
        c = std::make_unique<ringattn::runtime::KVCacheShard<S>>(*comm_, o, names);
      });
      shard_ = std::move(c);
    });
    comm_->set_timeout(ringattn::runtime::prompt_timeout(o, 1, comm_->size()));
  }

  std::vector<Index> positions(Index prompt_len) const {
    return std::visit([&](const auto& c) { return c->prompt_positions(prompt_len); }, shard_);
  }
  // This rank's prompt shard; o [B, L, H, D] and lse [B, H, L] in the accumulation type.
  void prefill(Index prompt_len, std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o,
               std::uintptr_t lse) {
    py::gil_scoped_release unlocked;
    std::visit(
        [&](auto& c) {
          // the watchdog for the prompt's forward, which covers the decode steps after it
          comm_->set_timeout(ringattn::runtime::prompt_timeout(c->options(), prompt_len, comm_->size()));
          c->prefill(prompt_len, ptr(c, q), ptr(c, k), ptr(c, v), out(c, o), out(c, lse));
        },
        shard_);
  }
  // This rank's shard of the prompt's K/V, kept without attending.
  void load(Index prompt_len, std::uintptr_t k, std::uintptr_t v) {
    py::gil_scoped_release unlocked;
    std::visit(
        [&](auto& c) {
          comm_->set_timeout(ringattn::runtime::prompt_timeout(c->options(), prompt_len, comm_->size()));
          c->load(prompt_len, ptr(c, k), ptr(c, v));
        },
        shard_);
  }
  // T new tokens, the same on every rank; o [B, T, H, D] and lse [B, H, T].
  void decode(Index T, std::uintptr_t q, std::uintptr_t k, std::uintptr_t v, std::uintptr_t o, std::uintptr_t lse) {
    py::gil_scoped_release unlocked;
    std::visit([&](auto& c) { c->decode(T, ptr(c, q), ptr(c, k), ptr(c, v), out(c, o), out(c, lse)); }, shard_);
  }
  Index length() const {
    return std::visit([](const auto& c) { return c->length(); }, shard_);
  }
  Index local_positions() const {
    return std::visit([](const auto& c) { return c->local_positions(); }, shard_);
  }
  Index resident_bytes() const {
    return std::visit([](const auto& c) { return c->resident_bytes(); }, shard_);
  }

 private:
  std::unique_ptr<ringattn::comm::Comm> comm_;
  std::variant<std::unique_ptr<ringattn::runtime::KVCacheShard<float>>,
               std::unique_ptr<ringattn::runtime::KVCacheShard<double>>,
               std::unique_ptr<ringattn::runtime::KVCacheShard<ringattn::core::bf16>>,
               std::unique_ptr<ringattn::runtime::KVCacheShard<ringattn::core::f16>>>
      shard_;
};

}  // namespace

void bind_kv_cache(py::module_& m) {
  // mpi4py's C API is a table of pointers local to each translation unit: this one imports it too.
  if (import_mpi4py() < 0) throw py::error_already_set();
  py::class_<KVCache>(m, "KVCache")
      .def(py::init<py::object, Index, Index, Index, Index, std::string, std::string, std::optional<Index>,
                    std::optional<double>, std::optional<Index>, std::optional<double>, std::string>())
      .def("positions", &KVCache::positions)
      .def("prefill", &KVCache::prefill)
      .def("load", &KVCache::load)
      .def("decode", &KVCache::decode)
      .def_property_readonly("length", &KVCache::length)
      .def_property_readonly("local_positions", &KVCache::local_positions)
      .def_property_readonly("resident_bytes", &KVCache::resident_bytes);
}
