# install(): the headers, one exported target set per component (namespace rein::), reinConfig.cmake and
# its version file. Installed layout, relative to the prefix:
#   include/rein.hpp, include/rein/...                  the headers
#   share/cmake/rein/reinConfig.cmake                   find_package(rein [COMPONENTS ...])
#   share/cmake/rein/reinConfigVersion.cmake            compatible within one major.minor (0.x may break)
#   share/cmake/rein/rein-<component>-targets.cmake     the target rein::<component>
#   share/cmake/rein/rein-<component>-dependencies.cmake  how the user's machine finds its dependencies
#   share/doc/rein/LICENSE
# A header-only package has nothing architecture-specific, hence share/ rather than lib/.

include(CMakePackageConfigHelpers)

set(REIN_INSTALL_CMAKEDIR "${CMAKE_INSTALL_DATADIR}/cmake/rein"
    CACHE STRING "Where rein's CMake package files are installed, relative to the prefix")

# rein_install_component(<target> <component> [DEPENDENCIES <file.cmake.in>])
#
# Installs <target> (whose EXPORT_NAME is <component>) as rein::<component>. The optional dependencies file
# is configured with @ONLY and runs inside reinConfig.cmake before the targets are loaded: it finds what
# the component needs and, when something is missing, sets rein_<component>_FOUND to FALSE and
# rein_<component>_NOT_FOUND_MESSAGE to say what.
function(rein_install_component target component)
  cmake_parse_arguments(arg "" "DEPENDENCIES" "" ${ARGN})
  if(NOT REIN_INSTALL)
    return()
  endif()
  install(TARGETS ${target} EXPORT rein-${component}-targets)
  install(EXPORT rein-${component}-targets
    NAMESPACE rein::
    FILE rein-${component}-targets.cmake
    DESTINATION "${REIN_INSTALL_CMAKEDIR}"
    COMPONENT rein)
  if(arg_DEPENDENCIES)
    set(configured "${PROJECT_BINARY_DIR}/rein-${component}-dependencies.cmake")
    configure_file("${arg_DEPENDENCIES}" "${configured}" @ONLY)
    install(FILES "${configured}" DESTINATION "${REIN_INSTALL_CMAKEDIR}" COMPONENT rein)
  endif()
endfunction()

if(REIN_INSTALL)
  install(DIRECTORY "${PROJECT_SOURCE_DIR}/include/"
    DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}"
    COMPONENT rein
    FILES_MATCHING PATTERN "*.hpp" PATTERN "*.ipp")
  install(FILES "${PROJECT_SOURCE_DIR}/LICENSE" DESTINATION "${CMAKE_INSTALL_DATADIR}/doc/rein" COMPONENT rein)

  configure_package_config_file("${PROJECT_SOURCE_DIR}/cmake/reinConfig.cmake.in"
    "${PROJECT_BINARY_DIR}/reinConfig.cmake"
    INSTALL_DESTINATION "${REIN_INSTALL_CMAKEDIR}")
  write_basic_package_version_file("${PROJECT_BINARY_DIR}/reinConfigVersion.cmake"
    COMPATIBILITY SameMinorVersion
    ARCH_INDEPENDENT)
  install(FILES "${PROJECT_BINARY_DIR}/reinConfig.cmake" "${PROJECT_BINARY_DIR}/reinConfigVersion.cmake"
    DESTINATION "${REIN_INSTALL_CMAKEDIR}"
    COMPONENT rein)
endif()

if(TARGET rein)
  rein_install_component(rein rein DEPENDENCIES "${PROJECT_SOURCE_DIR}/cmake/package/rein-dependencies.cmake.in")
endif()
rein_install_component(rein_standalone standalone
  DEPENDENCIES "${PROJECT_SOURCE_DIR}/cmake/package/standalone-dependencies.cmake.in")
