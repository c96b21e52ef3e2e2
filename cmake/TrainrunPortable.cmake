# The portable collectives library: build/portable/lib/libtrainrun_collectives.so.0, the same
# library as the installed one (cmake/TrainrunInstall.cmake) but with gRPC, Protobuf, Abseil,
# c-ares, RE2, OpenSSL and zlib inside it, so that it needs nothing but glibc and libstdc++.
# With the executables (cmake/TrainrunStaticDeps.cmake) it makes the bundle of
# scripts/portable-build.sh, which runs on a host that has none of Debian's libraries.
# Target trainrun_collectives_portable, not built by default (its first build downloads ~8 MB of
# Debian sources, below); included once, at the end of the top-level CMakeLists.txt.
#
# Why sources are downloaded: Debian compiled the static archives of Protobuf, Abseil and RE2 as
# position-independent *executable* code (gcc's default -fPIE; gRPC's, c-ares' and upb's are
# -fPIC), and six of their objects that the library needs read thread-local variables in the
# local-exec model, which only an executable may contain: the linker refuses them in a shared
# object ("relocation R_X86_64_TPOFF32 ... can not be used when making a shared object"). No
# header-only mode exists for these libraries, so those six files are compiled once more here,
# as -fPIC, from Debian's own source packages at the installed versions (cmake/
# fetch_debian_sources.sh), and take the place of Debian's objects in the link:
#   libprotobuf.a  arena.o
#   libabsl_*.a    sysinfo, cordz_functions, pool_urbg, raw_hash_set
#   libre2.a       re2.o
# cmake/portable_check_objects.sh then checks that each defines exactly the global symbols of
# Debian's member it replaces (so the same file, configured alike, was compiled).
#
# What the library exports (cmake/trainrun_portable.map.in): trainrun's symbols (C++ and C API)
# and Abseil's functions (the public headers use absl::Status; the Python extension built against
# the bundle takes Abseil from here); everything else stays inside, libstdc++ included
# (-static-libstdc++: Debian's archives read its vtables at fixed offsets, as an executable
# would), so a process that also loads another gRPC, Protobuf or OpenSSL (PyTorch's, Python's)
# keeps the two apart.
if(NOT (TRAINRUN_STATIC_DEPS AND CMAKE_SYSTEM_NAME STREQUAL "Linux"
        AND TARGET trainrun_collectives_shared AND DEFINED TRAINRUN_COLLECTIVES_ARCHIVES))
  return()
endif()

set(_sources ${PROJECT_BINARY_DIR}/portable/debian-sources)
set(_protobuf ${_sources}/protobuf)
set(_abseil ${_sources}/abseil)
set(_re2 ${_sources}/re2)
set(_protobuf_files ${_protobuf}/src/google/protobuf/arena.cc)
set(_abseil_files
  ${_abseil}/absl/base/internal/sysinfo.cc
  ${_abseil}/absl/strings/internal/cordz_functions.cc
  ${_abseil}/absl/random/internal/pool_urbg.cc
  ${_abseil}/absl/container/internal/raw_hash_set.cc)
set(_re2_files ${_re2}/re2/re2.cc)
# Fetched again (each source package only if its version changed) when the list here changes or
# when dpkg installs another version of one of the packages.
set(_packages libprotobuf-dev libabsl-dev libre2-dev)
set(_package_lists)
foreach(package ${_packages})
  file(GLOB _list /var/lib/dpkg/info/${package}.list /var/lib/dpkg/info/${package}:*.list)
  list(APPEND _package_lists ${_list})
endforeach()
add_custom_command(
  OUTPUT ${_sources}/stamp
  BYPRODUCTS ${_protobuf_files} ${_abseil_files} ${_re2_files}
  COMMAND ${PROJECT_SOURCE_DIR}/cmake/fetch_debian_sources.sh ${_sources} ${_packages}
  DEPENDS ${PROJECT_SOURCE_DIR}/cmake/fetch_debian_sources.sh
          ${PROJECT_SOURCE_DIR}/cmake/TrainrunPortable.cmake ${_package_lists}
  COMMENT "Fetching Debian's Protobuf, Abseil and RE2 sources (the portable library)"
  VERBATIM)
add_custom_target(trainrun_portable_sources DEPENDS ${_sources}/stamp)

# Compiled as Debian compiled them (their debian/rules and build systems: Protobuf's config.h
# definitions, -O2 without NDEBUG and C++17 for Protobuf and Abseil, -O3 -DNDEBUG and C++11 for
# RE2), but -fPIC. Abseil's headers are the installed ones (Debian configures
# absl/base/options.h at build time).
function(_trainrun_pic_objects name standard)
  cmake_parse_arguments(PARSE_ARGV 2 arg "" "" "SOURCES;INCLUDES;OPTIONS")
  add_library(${name} OBJECT EXCLUDE_FROM_ALL ${arg_SOURCES})
  add_dependencies(${name} trainrun_portable_sources)
  set_target_properties(${name} PROPERTIES
    POSITION_INDEPENDENT_CODE ON CXX_STANDARD ${standard} CXX_EXTENSIONS OFF)
  target_include_directories(${name} SYSTEM PRIVATE ${arg_INCLUDES})
  target_compile_options(${name} PRIVATE -pthread -w ${arg_OPTIONS})
endfunction()
_trainrun_pic_objects(trainrun_portable_protobuf_pic 17
  SOURCES ${_protobuf_files}
  INCLUDES ${_protobuf}/src
  OPTIONS -O2 -UNDEBUG -DHAVE_PTHREAD=1 -DHAVE_ZLIB=1)
_trainrun_pic_objects(trainrun_portable_abseil_pic 17
  SOURCES ${_abseil_files}
  OPTIONS -O2 -UNDEBUG)
_trainrun_pic_objects(trainrun_portable_re2_pic 11
  SOURCES ${_re2_files}
  INCLUDES ${_re2}
  OPTIONS -O3 -DNDEBUG)

# The version script, with every function Debian's Abseil archives define.
execute_process(
  COMMAND sh -c "nm -g --defined-only --format=posix /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}/libabsl_*.a 2>/dev/null | awk '$2 ~ /^[TW]$/ && $1 ~ /^(_ZN4absl|_ZNK4absl|Absl)/ {print \"    \" $1 \";\"}' | sort -u"
  OUTPUT_VARIABLE ABSL_FUNCTIONS OUTPUT_STRIP_TRAILING_WHITESPACE)
if(ABSL_FUNCTIONS STREQUAL "")
  message(WARNING "trainrun: no Abseil archives in /usr/lib/${CMAKE_LIBRARY_ARCHITECTURE}; "
                  "the portable library is not defined")
  return()
endif()
set(_map ${PROJECT_BINARY_DIR}/portable/trainrun_portable.map)
configure_file(${PROJECT_SOURCE_DIR}/cmake/trainrun_portable.map.in ${_map} @ONLY)
unset(ABSL_FUNCTIONS)

# The library: every object of trainrun's worker-side archives (those of the installed library),
# the objects above, and the static archives of the rest (cmake/link_static_deps.sh swaps the .so
# files the targets name for their .a files).
set(_archives ${TRAINRUN_COLLECTIVES_ARCHIVES})
set(_files)
foreach(archive ${_archives})
  list(APPEND _files $<TARGET_FILE:${archive}>)
endforeach()
list(JOIN _files " " _joined)
add_library(trainrun_collectives_portable SHARED EXCLUDE_FROM_ALL
  ${PROJECT_BINARY_DIR}/lib/trainrun_collectives_bundle.cc
  $<TARGET_OBJECTS:trainrun_portable_protobuf_pic>
  $<TARGET_OBJECTS:trainrun_portable_abseil_pic>
  $<TARGET_OBJECTS:trainrun_portable_re2_pic>
  ${PROJECT_SOURCE_DIR}/cmake/portable/glibc_compat.c)
set_target_properties(trainrun_collectives_portable PROPERTIES
  OUTPUT_NAME trainrun_collectives
  VERSION ${PROJECT_VERSION}
  SOVERSION ${PROJECT_VERSION_MAJOR}
  LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/portable/lib
  RULE_LAUNCH_LINK ${PROJECT_SOURCE_DIR}/cmake/link_static_deps.sh
  LINK_DEPENDS ${_map})
add_dependencies(trainrun_collectives_portable ${_archives})
target_link_options(trainrun_collectives_portable PRIVATE
  "SHELL:-Wl,--whole-archive ${_joined} -Wl,--no-whole-archive"
  LINKER:--no-undefined
  LINKER:--version-script=${_map}
  LINKER:-Bsymbolic
  LINKER:--wrap=stderr
  LINKER:--wrap=arc4random
  -static-libstdc++)
target_link_libraries(trainrun_collectives_portable PRIVATE ${_archives} OpenSSL::SSL)
add_custom_command(TARGET trainrun_collectives_portable PRE_LINK
  COMMAND ${PROJECT_SOURCE_DIR}/cmake/portable_check_objects.sh
          "$<TARGET_OBJECTS:trainrun_portable_protobuf_pic>"
          "$<TARGET_OBJECTS:trainrun_portable_abseil_pic>"
          "$<TARGET_OBJECTS:trainrun_portable_re2_pic>"
  COMMAND_EXPAND_LISTS VERBATIM)

unset(_sources)
unset(_files)
unset(_joined)
