// kiln._core: the C++ loader (loader/loader.h) for Python, through pybind11. The Python package
// (python/kiln/__init__.py) wraps it: rank/world discovery, state_dict as plain data, iteration.
//
// What this layer adds to the loader:
// - The GIL is released whenever C++ may wait or work (open, next batch, restore, set_weights,
//   state), so other Python threads run while the loader's own threads prefetch.
// - A mutex serialises every call into one Loader (the loader is driven by one thread; Python
//   code may call it from several), so no interleaving of calls can corrupt it.
// - Batches reach NumPy without copies: `tokens` and `domain` are views of the batch's own
//   buffers, kept alive by the Batch object they came from.
// - Every failure is a Python exception carrying the C++ message: kUsage/kConfig -> ValueError,
//   kNotFound -> FileNotFoundError, kData -> kiln.DataError, kIo -> OSError, else RuntimeError.
// - A loader used after fork() (its threads do not exist in the child) raises instead of
//   waiting forever, and is never joined there.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <unistd.h>

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "common/status.h"
#include "loader/loader.h"

namespace py = pybind11;

namespace kiln::python {
namespace {

namespace kl = ::kiln::loader;  // the loader's public API

// kiln.DataError, created when the module is imported.
PyObject* g_data_error = nullptr;
struct DataErrorTag {};

// Raises the Python exception for a failed Status (the GIL must be held).
[[noreturn]] void raise(const Status& st) {
  const std::string msg = st.to_string();
  PyObject* type = PyExc_RuntimeError;
  switch (st.code()) {
    case StatusCode::kUsage:
    case StatusCode::kConfig:
      type = PyExc_ValueError;
      break;
    case StatusCode::kNotFound:
      type = PyExc_FileNotFoundError;
      break;
    case StatusCode::kData:
      type = g_data_error;
      break;
    case StatusCode::kIo:
      type = PyExc_OSError;
      break;
    default:
      break;
  }
  PyErr_SetString(type, msg.c_str());
  throw py::error_already_set();
}

template <typename T>
T value_or_raise(Result<T> r) {
  if (!r.is_ok()) raise(r.status());
  return std::move(r).value();
}

void ok_or_raise(const Status& st) {
  if (!st.is_ok()) raise(st);
}

// A sample id as stored in <key>.json (raw JSON text) -> str / int / float.
py::object id_to_python(const std::string& raw) {
  const nlohmann::json j = nlohmann::json::parse(raw, nullptr, /*allow_exceptions=*/false);
  if (j.is_string()) return py::str(j.get<std::string>());
  if (j.is_number_unsigned()) return py::int_(j.get<uint64_t>());
  if (j.is_number_integer()) return py::int_(j.get<int64_t>());
  if (j.is_number_float()) return py::float_(j.get<double>());
  return py::str(raw);
}

// One batch; NumPy views of its buffers keep this object (and so the buffers) alive.
struct PyBatch {
  kl::Batch batch;
  bool has_ids = false;

  int64_t width() const { return batch.seq_len + 1; }
};

// A Loader with a mutex and the process it was opened in.
class PyLoader {
 public:
  PyLoader(std::unique_ptr<kl::Loader> loader, bool sample_ids)
      : loader_(std::move(loader)), sample_ids_(sample_ids), pid_(::getpid()) {}

  ~PyLoader() {
    // After fork() the loader's threads do not exist here: joining them would hang.
    if (::getpid() != pid_) (void)loader_.release();
  }

  // Runs fn(loader) without the GIL, under the mutex. Raises when closed or forked.
  template <typename Fn>
  auto call(Fn&& fn) {
    check_usable();
    py::gil_scoped_release nogil;
    std::lock_guard lk(mu_);
    if (!loader_) {
      using R = decltype(fn(*loader_));
      return R(Status::usage("the loader is closed"));
    }
    return fn(*loader_);
  }

  void close() {
    if (::getpid() != pid_) return;
    std::unique_ptr<kl::Loader> doomed;
    {
      py::gil_scoped_release nogil;
      std::lock_guard lk(mu_);
      doomed = std::move(loader_);
      doomed.reset();  // joins the worker threads
    }
  }

  bool closed() const { return !loader_; }
  bool sample_ids() const { return sample_ids_; }

 private:
  void check_usable() const {
    if (::getpid() != pid_) {
      throw py::value_error(
          "this kiln.Loader was opened in another process (before fork()); its prefetch threads "
          "do not exist here. Open the loader in the process that reads it (with "
          "torch.utils.data.DataLoader use num_workers=0: the prefetch already runs in C++ "
          "threads)");
    }
  }

  std::unique_ptr<kl::Loader> loader_;
  std::mutex mu_;
  bool sample_ids_;
  pid_t pid_;
};

py::dict weights_to_dict(const kl::DomainWeights& w) {
  py::dict d;
  for (const auto& [name, weight] : w) d[py::str(name)] = weight;
  return d;
}

kl::DomainWeights weights_from_dict(const py::dict& d) {
  kl::DomainWeights::Map m;
  for (const auto& [k, v] : d) {
    if (!py::isinstance<py::str>(k)) throw py::type_error("weights: domain names must be str");
    const std::string name = k.cast<std::string>();
    if (py::isinstance<py::str>(v) || !(py::isinstance<py::float_>(v) || py::isinstance<py::int_>(v) ||
                                        py::hasattr(v, "__float__"))) {
      throw py::type_error("weights: the weight of '" + name + "' must be a number, got " +
                           py::repr(v).cast<std::string>());
    }
    m[name] = v.cast<double>();
  }
  return kl::DomainWeights(std::move(m));
}

std::unique_ptr<PyLoader> open_loader(const std::string& dataset, int64_t seq_len,
                                      int64_t micro_batch, uint64_t seed,
                                      std::optional<py::dict> weights, int rank, int world,
                                      int workers, int prefetch, const std::string& split,
                                      bool skip_bad_shards, bool verify_checksums, bool sample_ids,
                                      int64_t global_batch, int64_t partitions, bool repartition) {
  kl::LoaderOptions o;
  o.global_batch = global_batch;
  o.partitions = partitions;
  o.repartition = repartition;
  o.seq_len = seq_len;
  o.micro_batch = micro_batch;
  o.seed = seed;
  o.dp_rank = rank;
  o.dp_world = world;
  o.workers = workers;
  o.prefetch_depth = prefetch;
  o.skip_bad_shards = skip_bad_shards;
  o.verify_checksums = verify_checksums;
  o.sample_ids = sample_ids;
  if (split == "val") {
    o.val_split = true;
  } else if (split != "train") {
    throw py::value_error("split must be 'train' or 'val', got '" + split + "'");
  }
  if (weights) {
    if (weights->empty()) {
      throw py::value_error("weights: no domain given (None means the manifest's token shares)");
    }
    o.weights = weights_from_dict(*weights);
  }
  Result<std::unique_ptr<kl::Loader>> r = Status::internal("not opened");
  {
    py::gil_scoped_release nogil;
    r = kl::Loader::open(dataset, o);
  }
  return std::make_unique<PyLoader>(value_or_raise(std::move(r)), sample_ids);
}

py::object next_batch(const py::object& self_obj) {
  PyLoader& self = self_obj.cast<PyLoader&>();
  kl::Batch b = value_or_raise(self.call([](kl::Loader& l) { return l.next_batch(); }));
  auto holder = std::make_unique<PyBatch>();
  holder->batch = std::move(b);
  holder->has_ids = self.sample_ids();
  return py::cast(std::move(holder));
}

// Offsets per row where a document begins.
py::list doc_starts(const PyBatch& pb) {
  py::list rows;
  for (int64_t r = 0; r < pb.batch.micro_batch; ++r) {
    std::vector<int32_t> s = pb.batch.doc_starts(r);
    py::array_t<int32_t> a(static_cast<py::ssize_t>(s.size()));
    std::copy(s.begin(), s.end(), a.mutable_data());
    rows.append(std::move(a));
  }
  return rows;
}

// Per token: position within its piece of a document (0 at the row start and at each document
// start), or the index of that piece within the row.
py::array_t<int32_t> per_token(const PyBatch& pb, bool segments) {
  const kl::Batch& b = pb.batch;
  py::array_t<int32_t> out({b.micro_batch, pb.width()});
  int32_t* o = out.mutable_data();
  for (int64_t r = 0; r < b.micro_batch; ++r) {
    int32_t* row = o + r * pb.width();
    int32_t segment = 0;
    for (const kl::DocSpan& s : b.docs[r]) {
      for (uint32_t i = 0; i < s.length; ++i) {
        row[s.seq_offset + i] = segments ? segment : static_cast<int32_t>(i);
      }
      ++segment;
    }
  }
  return out;
}

}  // namespace
}  // namespace kiln::python

PYBIND11_MODULE(_core, m) {
  using namespace kiln::python;
  using kiln::python::PyBatch;
  using kiln::python::PyLoader;
  m.doc() = "Kiln's C++ loader (use the kiln package, not this module directly)";

  static py::exception<kiln::python::DataErrorTag> data_error(m, "DataError", PyExc_RuntimeError);
  data_error.doc() =
      "A dataset that cannot be read as it should: a missing or damaged shard, a checksum "
      "mismatch, a malformed sample. The message names the shard and the member.";
  g_data_error = data_error.ptr();

  m.def(
      "merge_states",
      [](const std::vector<std::string>& texts) {
        std::vector<kl::LoaderState> states;
        for (size_t i = 0; i < texts.size(); ++i) {
          auto s = kl::LoaderState::from_json(texts[i], "states[" + std::to_string(i) + "]");
          if (!s.is_ok()) raise(kiln::Status::config(s.status().to_string()));
          states.push_back(std::move(s).value());
        }
        return value_or_raise(kl::LoaderState::merge(states)).to_json();
      },
      "JSON of the merged state of every rank's state (JSON texts)");

  py::class_<PyBatch>(m, "Batch", "One step's data for this rank (see kiln.Loader)")
      .def_property_readonly(
          "global_rows",
          [](const PyBatch& b) {
            py::list rows;
            for (int64_t j : b.batch.global_rows) rows.append(j);
            return rows;
          },
          "per row, its index in the step's global batch")
      .def_property_readonly(
          "micro", [](const PyBatch& b) { return b.batch.micro; },
          "which micro-batch of the step (0 .. accumulation - 1)")
      .def_property_readonly(
          "step", [](const PyBatch& b) { return b.batch.step; }, "0-based step index of this batch")
      .def_property_readonly("micro_batch", [](const PyBatch& b) { return b.batch.micro_batch; })
      .def_property_readonly("seq_len", [](const PyBatch& b) { return b.batch.seq_len; })
      .def_property_readonly(
          "wait_ms", [](const PyBatch& b) { return b.batch.wait_ms; },
          "how long the loader blocked waiting for this batch")
      .def_property_readonly(
          "tokens",
          [](py::object self) {
            const PyBatch& b = self.cast<const PyBatch&>();
            const auto w = static_cast<py::ssize_t>(b.width());
            return py::array_t<uint32_t>({static_cast<py::ssize_t>(b.batch.micro_batch), w},
                                         {w * static_cast<py::ssize_t>(sizeof(uint32_t)),
                                          static_cast<py::ssize_t>(sizeof(uint32_t))},
                                         b.batch.tokens.data(), self);
          },
          "uint32 [micro_batch, seq_len + 1] token ids (a view, no copy): inputs [:, :-1], "
          "targets [:, 1:]")
      .def_property_readonly(
          "domain",
          [](py::object self) {
            const PyBatch& b = self.cast<const PyBatch&>();
            return py::array_t<int32_t>({static_cast<py::ssize_t>(b.batch.domains.size())},
                                        {static_cast<py::ssize_t>(sizeof(int32_t))},
                                        b.batch.domains.data(), self);
          },
          "int32 [micro_batch] domain id per sequence (an index into Loader.domains)")
      .def_property_readonly("doc_starts", &doc_starts,
                             "per row, an int32 array of the offsets where a document begins")
      .def_property_readonly(
          "position_ids", [](const PyBatch& b) { return per_token(b, false); },
          "int32 [micro_batch, seq_len + 1]: each token's position counted from the start of "
          "its document in this row (0 at the row start and at every document start)")
      .def_property_readonly(
          "segment_ids", [](const PyBatch& b) { return per_token(b, true); },
          "int32 [micro_batch, seq_len + 1]: which piece of a document each token belongs to, "
          "0, 1, ... within the row (equal ids: same document; for block-diagonal attention)")
      .def_property_readonly(
          "pieces",
          [](const PyBatch& b) {
            py::list rows;
            for (const auto& spans : b.batch.docs) {
              py::list row;
              for (const kl::DocSpan& s : spans) {
                row.append(py::make_tuple(s.shard, s.member, s.epoch, s.doc_offset, s.length,
                                          s.seq_offset));
              }
              rows.append(std::move(row));
            }
            return rows;
          },
          "per row, the pieces of documents it holds, in order, as tuples (shard, member, epoch, "
          "doc_offset, length, seq_offset): the manifest's shard index, the sample's index in "
          "the shard, the domain's epoch, the first token's index in the document (0: the "
          "document starts here), tokens held (counting the document's eos when held), and the "
          "position in the row")
      .def_property_readonly(
          "samples",
          [](const PyBatch& b) {
            if (!b.has_ids) {
              throw py::value_error("sample ids were not read: open the Loader with sample_ids=True");
            }
            py::list rows;
            for (const auto& spans : b.batch.docs) {
              py::list ids;
              for (const kl::DocSpan& s : spans) ids.append(id_to_python(s.id));
              rows.append(std::move(ids));
            }
            return rows;
          },
          "per row, the input ids of the documents whose tokens it holds (sample_ids=True)");

  py::class_<PyLoader>(m, "Loader")
      .def(py::init(&open_loader), py::arg("dataset"), py::kw_only(), py::arg("seq_len"),
           py::arg("micro_batch"), py::arg("seed"), py::arg("weights"), py::arg("rank"),
           py::arg("world"), py::arg("workers"), py::arg("prefetch"), py::arg("split"),
           py::arg("skip_bad_shards"), py::arg("verify_checksums"), py::arg("sample_ids"),
           py::arg("global_batch"), py::arg("partitions"), py::arg("repartition"))
      .def("next", &next_batch)
      .def("set_weights",
           [](PyLoader& self, const py::dict& weights) {
             const kl::DomainWeights w = weights_from_dict(weights);
             ok_or_raise(self.call([&](kl::Loader& l) { return l.set_weights(w); }));
           })
      .def_property_readonly("weights",
                             [](PyLoader& self) {
                               return weights_to_dict(value_or_raise(self.call(
                                   [](kl::Loader& l) -> kiln::Result<kl::DomainWeights> {
                                     return l.weights();
                                   })));
                             })
      .def_property_readonly("domains",
                             [](PyLoader& self) {
                               return value_or_raise(self.call(
                                   [](kl::Loader& l) -> kiln::Result<std::vector<std::string>> {
                                     return l.domain_names();
                                   }));
                             })
      .def("state_json",
           [](PyLoader& self) {
             return value_or_raise(self.call([](kl::Loader& l) -> kiln::Result<std::string> {
               return l.state().to_json();
             }));
           })
      .def("restore_json",
           [](PyLoader& self, const std::vector<std::string>& texts) {
             if (texts.empty()) throw py::value_error("load_state_dict: no state given");
             ok_or_raise(self.call([&](kl::Loader& l) -> kiln::Status {
               std::vector<kl::LoaderState> states;
               for (size_t i = 0; i < texts.size(); ++i) {
                 const std::string origin =
                     texts.size() == 1 ? "state_dict" : "state_dict[" + std::to_string(i) + "]";
                 auto s = kl::LoaderState::from_json(texts[i], origin);
                 if (!s.is_ok()) {  // a malformed state is the caller's argument: ValueError
                   return kiln::Status::config(s.status().to_string());
                 }
                 states.push_back(std::move(s).value());
               }
               kl::LoaderState state = states.front();
               if (states.size() > 1) {
                 auto merged = kl::LoaderState::merge(states);
                 if (!merged.is_ok()) return merged.status();
                 state = std::move(merged).value();
               }
               return l.restore(state);
             }));
           })
      .def("stats",
           [](PyLoader& self) {
             const kl::LoaderStats s = value_or_raise(
                 self.call([](kl::Loader& l) -> kiln::Result<kl::LoaderStats> {
                   return l.stats();
                 }));
             py::dict domains;
             for (const auto& d : s.domains) {
               py::dict e;
               e["epoch"] = d.epoch;
               e["sequences"] = d.sequences;
               domains[py::str(d.name)] = e;
             }
             py::dict out;
             out["step"] = s.step;
             out["tokens"] = s.tokens;
             out["shards_read"] = s.shards_read;
             out["tar_bytes"] = s.tar_bytes;
             out["skipped_shards"] = s.skipped_shards;
             out["wait_ms_total"] = s.wait_ms_total;
             out["domains"] = domains;
             return out;
           })
      .def("close", &PyLoader::close)
      .def_property_readonly("closed", &PyLoader::closed);
}
