# CTest test consumer_fetchcontent_git: the README's FetchContent snippet (GIT_REPOSITORY + GIT_TAG <commit>)
# run against a bare clone of this checkout, reached by a file:// URL, so no network is needed.
#   cmake -DGIT_EXECUTABLE=... -DREIN_SOURCE_DIR=<checkout> -DWORK_DIR=<dir> <run_consumer.cmake's variables>
#         -P fetchcontent_git.cmake
# What is tested is the checkout's last commit (its HEAD): uncommitted changes are not in the clone. Prints
# "SKIPPED:" (CTest's skip pattern for this test) when git is missing or the source is not a Git checkout.
if(NOT GIT_EXECUTABLE)
  message("SKIPPED: git was not found when rein was configured")
  return()
endif()
execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${REIN_SOURCE_DIR}" rev-parse --verify HEAD
  RESULT_VARIABLE result OUTPUT_VARIABLE commit ERROR_QUIET OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT result EQUAL 0)
  message("SKIPPED: ${REIN_SOURCE_DIR} is not a Git checkout with a commit")
  return()
endif()
execute_process(COMMAND "${GIT_EXECUTABLE}" -C "${REIN_SOURCE_DIR}" status --porcelain --untracked-files=no
  OUTPUT_VARIABLE changes)
if(changes)
  message(STATUS "the checkout has uncommitted changes: this test uses its last commit, ${commit}")
endif()

set(remote "${WORK_DIR}/rein.git")
file(REMOVE_RECURSE "${remote}")
execute_process(COMMAND "${GIT_EXECUTABLE}" clone --quiet --bare "${REIN_SOURCE_DIR}" "${remote}"
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "git clone --bare ${REIN_SOURCE_DIR} failed (${result})")
endif()

message(STATUS "FetchContent of file://${remote} at ${commit}")
set(ARGS "-DREIN_GIT_REPOSITORY=file://${remote}|-DREIN_GIT_TAG=${commit}")
include("${CMAKE_CURRENT_LIST_DIR}/run_consumer.cmake")
