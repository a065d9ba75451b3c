// Happens-before edges for oneTBB parallel calls, for ThreadSanitizer builds.
//
// Debian's libtbb is not instrumented, so ThreadSanitizer cannot see how it hands work to its
// workers and back: without help, every result a task writes and the caller reads after the call
// looks like a race, and suppressing those would hide real races between tasks too
// (docs/HARDENING.md "Sanitizers"). Every oneTBB call in Kiln therefore goes through these
// wrappers, which tell TSan about the fork (the caller's writes before the call are visible to every
// task), the join (every task's writes are visible to the caller after the call) and, in a
// pipeline, the hand-off of each item from one filter to the next and the order of a serial
// filter's calls. Nothing else: two tasks of one call stay unordered, so a race between them is
// reported. In a build without -fsanitize=thread every function here is an empty inline and
// tbb's calls are made exactly as written.
//
// Use (one ForkJoin per parallel call, on the caller's stack):
//   kiln::tsan::ForkJoin fj;
//   tbb::parallel_for(range, fj.task([&](const auto& r) { ... }));
//   fj.join();
// task_group: group.run(fj.task(f)) for each task, then group.wait(); fj.join().
// parallel_pipeline: fj.serial_filter(f) / fj.parallel_filter(f) for each filter (items are
// pointers), then fj.join().
// parallel_sort: kiln::tsan::parallel_sort (a serial std::sort under TSan: the element moves run
// inside libstdc++ code called from uninstrumented tasks, so no annotation could cover them).
#pragma once

#include <tbb/parallel_pipeline.h>
#include <tbb/parallel_sort.h>

#include <algorithm>
#include <type_traits>
#include <utility>

#if defined(__SANITIZE_THREAD__)
#define KILN_TSAN 1
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
#define KILN_TSAN 1
#endif
#endif

#ifdef KILN_TSAN
extern "C" void __tsan_acquire(void* addr);
extern "C" void __tsan_release(void* addr);
#endif

namespace kiln::tsan {

// TSan's acquire / release on an address (no-ops without TSan).
inline void acquire(const void* addr) {
#ifdef KILN_TSAN
  __tsan_acquire(const_cast<void*>(addr));
#else
  (void)addr;
#endif
}
inline void release(const void* addr) {
#ifdef KILN_TSAN
  __tsan_release(const_cast<void*>(addr));
#else
  (void)addr;
#endif
}

class ForkJoin;

namespace detail {

// A body handed to oneTBB: the caller's function plus the edges. oneTBB copies bodies and runs
// them on other threads through its own (invisible) hand-offs, and reads them before any edge of
// ours could be acquired, so every construction and copy ends by releasing the body's own address,
// which every copy and call acquires first (the sync address is the first member, which is
// destroyed last: nothing is touched after the destructor's release, so a later body built in the
// same reused task slot acquires it before writing). `kind`: a task, or a serial or parallel
// pipeline filter.
enum class BodyKind { task, serial_filter, parallel_filter };

template <class F, BodyKind kind>
class Body {
 public:
  Body(const ForkJoin* fj, F f) : guard_(nullptr), fj_(fj), f_(std::move(f)) { release(&guard_); }
  Body(const Body& o) : guard_(&o), fj_(o.fj_), f_(o.f_) { release(&guard_); }
  Body(Body&& o) noexcept(std::is_nothrow_move_constructible_v<F>)
      : guard_(&o), fj_(o.fj_), f_(std::move(o.f_)) { release(&guard_); }
  Body& operator=(const Body&) = delete;

  template <class... Args>
    requires std::is_invocable_v<const F&, Args...>
  decltype(auto) operator()(Args&&... args) const;

 private:
  // Acquires this body's address (and, when built from another body, that one's) before any
  // member is written; releases this body's address when destroyed, after every other member.
  struct Guard {
    explicit Guard(const void* from) {
      acquire(this);
      if (from != nullptr) acquire(from);
    }
    Guard(const Guard&) = delete;
    ~Guard() { release(this); }
  };

  Guard guard_;
  const ForkJoin* fj_;
  F f_;
};

}  // namespace detail

// The fork and join of one oneTBB call. Construct it just before the call (that is the fork),
// wrap each body in task() or filter(), call join() just after the call returns. Not copyable:
// the wrapped bodies point at it, so it must outlive the call.
class ForkJoin {
 public:
  ForkJoin() { release(&fork_); }
  ForkJoin(const ForkJoin&) = delete;
  ForkJoin& operator=(const ForkJoin&) = delete;

  // After the call: every task's writes happen before what the caller does next.
  void join() const { acquire(&join_); }

  // A task body (parallel_for, parallel_for_each, task_group::run), held by value: each call
  // acquires the fork and releases into the join.
  template <class F>
  auto task(F f) const {
    return detail::Body<F, detail::BodyKind::task>(this, std::move(f));
  }

  // A parallel_pipeline filter body: as task(), plus the hand-off of each item (items are
  // pointers: the filter that returns one releases it, the filter that takes it acquires it) and,
  // for a serial filter, the order of its calls (each acquires what the previous one released).
  template <class F>
  auto serial_filter(F f) const {
    return detail::Body<F, detail::BodyKind::serial_filter>(this, std::move(f));
  }
  template <class F>
  auto parallel_filter(F f) const {
    return detail::Body<F, detail::BodyKind::parallel_filter>(this, std::move(f));
  }

 private:
  template <class F, detail::BodyKind>
  friend class detail::Body;
  char fork_ = 0;
  char join_ = 0;
};

template <class F, detail::BodyKind kind>
template <class... Args>
  requires std::is_invocable_v<const F&, Args...>
decltype(auto) detail::Body<F, kind>::operator()(Args&&... args) const {
  acquire(&guard_);
  acquire(&fj_->fork_);
  if constexpr (kind == BodyKind::serial_filter) acquire(&f_);
  if constexpr (kind != BodyKind::task) {
    const auto take = [](const auto& item) {
      if constexpr (std::is_pointer_v<std::decay_t<decltype(item)>>) {
        if (item != nullptr) acquire(item);
      }
    };
    (take(args), ...);
  }
  struct End {
    const Body* body;
    ~End() {
      if constexpr (kind == BodyKind::serial_filter) release(&body->f_);
      release(&body->fj_->join_);
    }
  } end{this};
  using Result = std::invoke_result_t<const F&, Args...>;
  if constexpr (std::is_void_v<Result>) {
    f_(std::forward<Args>(args)...);
  } else {
    Result out = f_(std::forward<Args>(args)...);
    if constexpr (kind != BodyKind::task && std::is_pointer_v<Result>) {
      if (out != nullptr) release(out);
    }
    return out;
  }
}

// tbb::parallel_sort, or std::sort in TSan builds (see the top of this file).
template <class It, class... Compare>
void parallel_sort(It first, It last, Compare... compare) {
#ifdef KILN_TSAN
  std::sort(first, last, compare...);
#else
  tbb::parallel_sort(first, last, compare...);
#endif
}

}  // namespace kiln::tsan
