/// @file
/// rein's test kit in one include: a clock that moves only when a test says so (testing::manual_clock)
/// the degrading-upstream simulation (rein/testing/upstream_sim.hpp) and its generated family of upstreams
/// (rein/testing/scenario_family.hpp). Not part of <rein.hpp>.
///
/// The test `testing_header` fails when this list and the headers under rein/testing/ disagree.
#pragma once

#include <rein/testing/manual_clock.hpp>
#include <rein/testing/scenario_family.hpp>
#include <rein/testing/upstream_sim.hpp>
