# Dependencies of the library itself. What is installed is found with find_package/find_path; a download
# (FetchContent) happens only when the user asks for it with REIN_FETCH_DEPENDENCIES=ON, and every download
# is pinned: a release archive with its SHA256, or a Git commit. (Test and benchmark frameworks are looked
# up in tests/ and benchmarks/.)
#
# Defines, when found:
#   Boost::headers     Boost 1.81 or newer (Boost.Asio, Boost.System headers), unless the parent has it;
#                      never looked up with REIN_STANDALONE_ASIO=ON
#   rein_asio          standalone Asio's include directory (Debian's libasio-dev ships no CMake package)
# and sets REIN_HAVE_BOOST / REIN_HAVE_STANDALONE_ASIO.
#
# Missing Boost is an error only where rein::rein is needed: in rein's own builds without
# REIN_STANDALONE_ASIO. A project that adds rein and links rein::standalone only is told with a status line
# that rein::rein is not defined, and nothing is downloaded for it.

include(FetchContent)

set(REIN_BOOST_MIN_VERSION 1.81)
set(REIN_ASIO_MIN_VERSION 102200)  # ASIO_VERSION of 1.22.0, Debian 12's libasio-dev

find_package(Threads REQUIRED)

# ---- Boost (headers only) -------------------------------------------------------------------------------
# A parent project may already provide Boost::headers (its own find_package or a Boost superproject).
if(NOT TARGET Boost::headers AND NOT REIN_STANDALONE_ASIO)
  find_package(Boost ${REIN_BOOST_MIN_VERSION} CONFIG QUIET COMPONENTS headers)
  if(NOT Boost_FOUND AND REIN_FETCH_DEPENDENCIES)
    # The release archive has every header at its root and nothing needs building: populate it only
    # (SOURCE_SUBDIR names a folder without a CMakeLists.txt, so nothing is added as a subproject).
    # The SHA256 is the one Boost publishes for this archive.
    message(STATUS "rein: Boost >= ${REIN_BOOST_MIN_VERSION} not found, fetching Boost 1.84 headers")
    FetchContent_Declare(rein_boost
      URL https://archives.boost.io/release/1.84.0/source/boost_1_84_0.tar.bz2
      URL_HASH SHA256=cc4b893acf645c9d4b698e9a0f08ca8846aa5d6c68275c14c3e7949c24109454
      SOURCE_SUBDIR rein-headers-only)
    FetchContent_MakeAvailable(rein_boost)
    add_library(Boost::headers INTERFACE IMPORTED GLOBAL)
    target_include_directories(Boost::headers SYSTEM INTERFACE "${rein_boost_SOURCE_DIR}")
  endif()
endif()
if(TARGET Boost::headers)
  set(REIN_HAVE_BOOST TRUE)
else()
  set(REIN_HAVE_BOOST FALSE)
  if(REIN_STANDALONE_ASIO)
    # Asked for: nothing to say.
  elseif(PROJECT_IS_TOP_LEVEL)
    message(FATAL_ERROR "rein: Boost >= ${REIN_BOOST_MIN_VERSION} headers not found. Install them "
      "(Debian: libboost1.81-dev), set Boost_DIR, configure with -DREIN_FETCH_DEPENDENCIES=ON to download "
      "them, or use standalone Asio with -DREIN_STANDALONE_ASIO=ON.")
  else()
    message(STATUS "rein: Boost >= ${REIN_BOOST_MIN_VERSION} headers not found: rein::rein is not defined "
      "(rein::standalone is; set REIN_STANDALONE_ASIO=ON to skip looking for Boost)")
  endif()
endif()

# ---- Standalone Asio ------------------------------------------------------------------------------------
# No CMake package exists for it in Debian: find asio.hpp and check the version macro.
find_path(REIN_ASIO_INCLUDE_DIR asio.hpp DOC "Directory holding standalone Asio's asio.hpp")
set(REIN_HAVE_STANDALONE_ASIO FALSE)
if(REIN_ASIO_INCLUDE_DIR AND EXISTS "${REIN_ASIO_INCLUDE_DIR}/asio/version.hpp")
  file(STRINGS "${REIN_ASIO_INCLUDE_DIR}/asio/version.hpp" _rein_asio_version_line
       REGEX "^#define ASIO_VERSION [0-9]+")
  string(REGEX MATCH "[0-9]+" REIN_ASIO_VERSION "${_rein_asio_version_line}")
  if(REIN_ASIO_VERSION GREATER_EQUAL REIN_ASIO_MIN_VERSION)
    set(REIN_HAVE_STANDALONE_ASIO TRUE)
  else()
    message(STATUS "rein: standalone Asio ${REIN_ASIO_VERSION} in ${REIN_ASIO_INCLUDE_DIR} is older than 1.22")
  endif()
endif()
if(NOT REIN_HAVE_STANDALONE_ASIO AND REIN_STANDALONE_ASIO AND REIN_FETCH_DEPENDENCIES)
  message(STATUS "rein: standalone Asio >= 1.22 not found, fetching Asio 1.28.2")
  # The commit of the tag asio-1-28-2.
  FetchContent_Declare(rein_asio
    GIT_REPOSITORY https://github.com/chriskohlhoff/asio.git
    GIT_TAG        7609450f71434bdc9fbd9491a9505b423c2a8496
    SOURCE_SUBDIR  rein-headers-only)
  FetchContent_MakeAvailable(rein_asio)
  set(REIN_ASIO_INCLUDE_DIR "${rein_asio_SOURCE_DIR}/asio/include" CACHE PATH "" FORCE)
  set(REIN_HAVE_STANDALONE_ASIO TRUE)
endif()
if(REIN_HAVE_STANDALONE_ASIO)
  add_library(rein_asio INTERFACE)
  target_include_directories(rein_asio SYSTEM INTERFACE "$<BUILD_INTERFACE:${REIN_ASIO_INCLUDE_DIR}>")
elseif(REIN_STANDALONE_ASIO)
  message(FATAL_ERROR "rein: REIN_STANDALONE_ASIO is ON but standalone Asio >= 1.22 was not found. "
    "Install it (Debian: libasio-dev), set REIN_ASIO_INCLUDE_DIR, or turn on REIN_FETCH_DEPENDENCIES.")
endif()
