# Inventory of rein's headers (for the header checks of tests/headers). The umbrella headers include/rein.hpp
# and include/rein/testing.hpp are plain files; tests/headers/check_umbrella.cmake checks their lists.
#
# Sets in the including scope (paths relative to include/, e.g. rein/semaphore.hpp):
#   REIN_HEADERS             every header under include/rein/, detail/ included
#   REIN_BOOST_ONLY_HEADERS  headers that cannot build with standalone Asio
#   REIN_REDIS_HEADERS       headers that need hiredis
#
# The last two are read off the include lines, and propagate through rein's own includes:
#   - a header needs Boost if it includes <boost/...> and never mentions REIN_STANDALONE_ASIO (headers that
#     pick the flavour themselves, like config.hpp, do mention it);
#   - a header needs hiredis if it lives in rein/redis/ or includes <hiredis/...> or <sw/redis...>.

function(_rein_scan_headers include_dir)
  # Re-checked at every build only where the list matters (rein's own builds), not in users' projects.
  if(PROJECT_IS_TOP_LEVEL)
    file(GLOB_RECURSE paths CONFIGURE_DEPENDS "${include_dir}/rein/*.hpp")
  else()
    file(GLOB_RECURSE paths "${include_dir}/rein/*.hpp")
  endif()
  list(SORT paths)
  set(headers "")
  foreach(path IN LISTS paths)
    file(RELATIVE_PATH header "${include_dir}" "${path}")
    list(APPEND headers "${header}")
    get_filename_component(header_dir "${header}" DIRECTORY)
    file(STRINGS "${path}" include_lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
    file(STRINGS "${path}" flavour_aware REGEX "REIN_STANDALONE_ASIO")
    set(deps "")
    set(needs_boost FALSE)
    set(needs_redis FALSE)
    if(header MATCHES "^rein/redis/")
      set(needs_redis TRUE)
    endif()
    foreach(line IN LISTS include_lines)
      if(line MATCHES "<(rein/[^>]+)>")
        list(APPEND deps "${CMAKE_MATCH_1}")
      elseif(line MATCHES "\"([^\"]+)\"")
        cmake_path(SET dep NORMALIZE "${header_dir}/${CMAKE_MATCH_1}")
        list(APPEND deps "${dep}")
      elseif(line MATCHES "<boost/" AND NOT flavour_aware)
        set(needs_boost TRUE)
      elseif(line MATCHES "<(hiredis/|sw/redis)")
        set(needs_redis TRUE)
      endif()
    endforeach()
    set(_rein_deps_${header} "${deps}" PARENT_SCOPE)
    set(_rein_boost_${header} ${needs_boost} PARENT_SCOPE)
    set(_rein_redis_${header} ${needs_redis} PARENT_SCOPE)
  endforeach()
  set(REIN_HEADERS "${headers}" PARENT_SCOPE)
endfunction()

# A header needs what any rein header it includes needs: iterate until nothing changes.
function(_rein_propagate kind)
  set(changed TRUE)
  while(changed)
    set(changed FALSE)
    foreach(header IN LISTS REIN_HEADERS)
      if(_rein_${kind}_${header})
        continue()
      endif()
      foreach(dep IN LISTS _rein_deps_${header})
        if(_rein_${kind}_${dep})
          set(_rein_${kind}_${header} TRUE)
          set(_rein_${kind}_${header} TRUE PARENT_SCOPE)
          set(changed TRUE)
          break()
        endif()
      endforeach()
    endforeach()
  endwhile()
endfunction()

set(_rein_include_dir "${PROJECT_SOURCE_DIR}/include")

_rein_scan_headers("${_rein_include_dir}")
_rein_propagate(boost)
_rein_propagate(redis)

set(REIN_BOOST_ONLY_HEADERS "")
set(REIN_REDIS_HEADERS "")
foreach(_rein_header IN LISTS REIN_HEADERS)
  if(_rein_boost_${_rein_header})
    list(APPEND REIN_BOOST_ONLY_HEADERS "${_rein_header}")
  endif()
  if(_rein_redis_${_rein_header})
    list(APPEND REIN_REDIS_HEADERS "${_rein_header}")
  endif()
endforeach()
