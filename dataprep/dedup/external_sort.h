// External merge sort of fixed-size records under a memory budget.
//
// add() buffers records; when the buffer reaches the budget it is sorted (in parallel) and
// written to a run file under `dir`. merge() sorts what is left and streams every record in
// ascending order (operator<) through a callback, k-way merging the runs with small read buffers,
// so memory stays near the budget however many records there are. Run files are removed when
// the sorter is destroyed. Not thread-safe; single use (add..., then merge once).
#pragma once

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <queue>
#include <string>
#include <type_traits>
#include <vector>

#include "common/status.h"
#include "common/tsan.h"

namespace kiln::prep {

template <typename T>
class ExternalSorter {
  static_assert(std::is_trivially_copyable_v<T>);

 public:
  ExternalSorter(std::string dir, std::string prefix, size_t memory_bytes)
      : dir_(std::move(dir)), prefix_(std::move(prefix)) {
    capacity_ = std::max<size_t>(1024, memory_bytes / sizeof(T));
    memory_bytes_ = capacity_ * sizeof(T);
  }
  ~ExternalSorter() {
    for (const auto& r : runs_) std::remove(r.c_str());
  }
  ExternalSorter(const ExternalSorter&) = delete;
  ExternalSorter& operator=(const ExternalSorter&) = delete;

  Status add(const T& rec) {
    if (buf_.size() >= capacity_) KILN_RETURN_IF_ERROR(spill());
    if (buf_.capacity() == 0) buf_.reserve(std::min<size_t>(capacity_, 1 << 16));
    buf_.push_back(rec);
    ++count_;
    return Status::ok();
  }
  Status add(const T* recs, size_t n) {
    for (size_t i = 0; i < n; ++i) KILN_RETURN_IF_ERROR(add(recs[i]));
    return Status::ok();
  }

  uint64_t count() const { return count_; }
  size_t runs() const { return runs_.size(); }
  uint64_t spilled_bytes() const { return spilled_bytes_; }

  // Calls fn(const T&) -> Status for every record in ascending order.
  template <typename F>
  Status merge(F&& fn) {
    tsan::parallel_sort(buf_.begin(), buf_.end());
    if (runs_.empty()) {
      for (const T& r : buf_) KILN_RETURN_IF_ERROR(fn(r));
      std::vector<T>().swap(buf_);
      return Status::ok();
    }
    if (!buf_.empty()) KILN_RETURN_IF_ERROR(write_run());
    std::vector<T>().swap(buf_);
    // k-way merge with one read buffer per run.
    const size_t k = runs_.size();
    const size_t per_run = std::max<size_t>(64, memory_bytes_ / sizeof(T) / (2 * k));
    struct Reader {
      FILE* f = nullptr;
      std::vector<T> buf;
      size_t at = 0, n = 0;
    };
    std::vector<Reader> readers(k);
    auto refill = [&](Reader& r) -> Status {
      r.n = std::fread(r.buf.data(), sizeof(T), r.buf.size(), r.f);
      r.at = 0;
      if (r.n == 0 && std::ferror(r.f)) return Status::io("reading sort run failed");
      return Status::ok();
    };
    Status st;
    for (size_t i = 0; i < k && st.is_ok(); ++i) {
      readers[i].f = std::fopen(runs_[i].c_str(), "rb");
      if (!readers[i].f) {
        st = Status::from_errno("open", runs_[i]);
        break;
      }
      readers[i].buf.resize(per_run);
      st = refill(readers[i]);
    }
    using Head = std::pair<T, size_t>;
    auto greater = [](const Head& a, const Head& b) {
      if (b.first < a.first) return true;
      if (a.first < b.first) return false;
      return a.second > b.second;
    };
    std::priority_queue<Head, std::vector<Head>, decltype(greater)> heap(greater);
    if (st.is_ok())
      for (size_t i = 0; i < k; ++i)
        if (readers[i].n > 0) heap.push({readers[i].buf[readers[i].at++], i});
    while (st.is_ok() && !heap.empty()) {
      Head h = heap.top();
      heap.pop();
      st = fn(h.first);
      if (!st.is_ok()) break;
      Reader& r = readers[h.second];
      if (r.at == r.n) {
        st = refill(r);
        if (!st.is_ok()) break;
      }
      if (r.at < r.n) heap.push({r.buf[r.at++], h.second});
    }
    for (auto& r : readers)
      if (r.f) std::fclose(r.f);
    for (const auto& r : runs_) std::remove(r.c_str());
    runs_.clear();
    return st;
  }

 private:
  Status spill() {
    tsan::parallel_sort(buf_.begin(), buf_.end());
    KILN_RETURN_IF_ERROR(write_run());
    buf_.clear();
    return Status::ok();
  }
  Status write_run() {
    std::string path = dir_ + "/" + prefix_ + "-run-" + std::to_string(runs_.size()) + ".bin";
    FILE* f = std::fopen(path.c_str(), "wb");
    if (!f) return Status::from_errno("create", path);
    runs_.push_back(path);
    size_t n = std::fwrite(buf_.data(), sizeof(T), buf_.size(), f);
    bool ok = n == buf_.size() && std::fclose(f) == 0;
    if (!ok) return Status::io("writing sort run failed (disk full?)").with_file(path);
    spilled_bytes_ += buf_.size() * sizeof(T);
    return Status::ok();
  }

  std::string dir_, prefix_;
  size_t capacity_ = 0;
  size_t memory_bytes_ = 0;
  std::vector<T> buf_;
  std::vector<std::string> runs_;
  uint64_t count_ = 0;
  uint64_t spilled_bytes_ = 0;
};

}  // namespace kiln::prep
