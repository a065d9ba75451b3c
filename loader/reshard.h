// Internal to loader/: moving a domain's position from one data-parallel world size to another.
#pragma once

#include <cstdint>
#include <vector>

#include "loader/loader.h"

namespace kiln::loader::detail {

// The cursor of rank `new_rank` of `new_world` that continues the run whose ranks 0..old_world-1
// were at `old` (one cursor per old rank, in rank order) for a domain of `samples` samples.
//
// Every sample the old ranks had not finished (their pending intervals, including a partly
// emitted sample, and the parts of epochs a lagging rank had not started yet, up to the newest
// epoch any rank started) is collected in (epoch, position) order and split into new_world
// contiguous runs of equal sample count (differing by at most one). After its run, each new rank
// continues with its regular part of the following epochs. So no sample of the current epochs is
// repeated or skipped.
LoaderState::DomainCursor reshard_cursor(const std::vector<LoaderState::DomainCursor>& old,
                                         int old_world, uint64_t samples, int new_world,
                                         int new_rank);

}  // namespace kiln::loader::detail
