# `cmake --install BUILD --prefix P`: the public headers, the static libraries, the `ringattn`
# command line, and a CMake package, so that an outside project does
#   find_package(ringattn REQUIRED)
#   target_link_libraries(app PRIVATE ringattn::ringattn)   # or ringattn::core: the math, no MPI
# The exported targets carry the include directory, C++20 and what they link; the build-only flags
# (warnings, tuning, sanitizers) are never part of them.
include(CMakePackageConfigHelpers)

set(RINGATTN_CMAKE_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/ringattn)
set(_ringattn_targets ringattn_core)
if(NOT RINGATTN_CORE_ONLY)
  list(APPEND _ringattn_targets ringattn)
endif()
# Read by ringattnConfig.cmake.in: whether the package has the MPI runtime.
set(RINGATTN_WITH_RUNTIME ON)
if(RINGATTN_CORE_ONLY)
  set(RINGATTN_WITH_RUNTIME OFF)
endif()

install(DIRECTORY ${PROJECT_SOURCE_DIR}/include/ringattn DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}
        FILES_MATCHING PATTERN "*.hpp")
install(TARGETS ${_ringattn_targets} EXPORT ringattnTargets
        ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
        LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR})
if(NOT RINGATTN_CORE_ONLY)
  install(TARGETS ringattn_app RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR})
endif()
install(EXPORT ringattnTargets NAMESPACE ringattn:: DESTINATION ${RINGATTN_CMAKE_DIR})

configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/ringattnConfig.cmake.in
                              ${PROJECT_BINARY_DIR}/ringattnConfig.cmake INSTALL_DESTINATION ${RINGATTN_CMAKE_DIR})
# 0.x: a minor version may change the API.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/ringattnConfigVersion.cmake VERSION ${PROJECT_VERSION}
                                 COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/ringattnConfig.cmake ${PROJECT_BINARY_DIR}/ringattnConfigVersion.cmake
        DESTINATION ${RINGATTN_CMAKE_DIR})
