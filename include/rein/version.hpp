/// @file
/// rein's version, as macros usable in `#if`.
///
/// The numbers are those of the CMake project (`project(rein VERSION ...)` in the top-level
/// CMakeLists.txt); the test `version_header` fails when the two disagree. Versions 0.x are compatible
/// within one minor version only.
#pragma once

/// The major version: an incompatible change of the API once it is 1 or more.
#define REIN_VERSION_MAJOR 0
/// The minor version: while the major version is 0, a minor version may break the API.
#define REIN_VERSION_MINOR 1
/// The patch version: fixes only.
#define REIN_VERSION_PATCH 0
/// The version as a string, "MAJOR.MINOR.PATCH".
#define REIN_VERSION "0.1.0"
