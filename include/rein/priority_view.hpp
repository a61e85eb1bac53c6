// The former name of rein::line_view (what `limiter.at_priority(c)` returns), kept for code written
// against it.
#pragma once

#include <rein/line_view.hpp>

namespace rein {

/// rein::line_view under its former name.
template <class Doors>
using priority_view = line_view<Doors>;

}  // namespace rein
