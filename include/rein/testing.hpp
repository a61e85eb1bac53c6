/// @file
/// rein's test kit in one include: a clock that moves only when a test says so (testing::manual_clock)
/// and the degrading-upstream simulation (rein/testing/upstream_sim.hpp). Not part of <rein.hpp>.
///
/// The test `testing_header` fails when this list and the headers under rein/testing/ disagree.
#pragma once

#include <rein/testing/manual_clock.hpp>
#include <rein/testing/upstream_sim.hpp>
