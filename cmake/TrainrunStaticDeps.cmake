# Executables link gRPC, Protobuf, Abseil, OpenSSL, libssh2, yaml-cpp and their dependencies from
# their static archives, and spdlog and fmt from their headers (option TRAINRUN_STATIC_DEPS, ON by
# default): `trainrun`, its rank shim and the test programs need nothing but glibc and libstdc++.
#
# Why: a process that loads them as shared libraries spends ~10 ms resolving ~60 libraries before
# main(); trainrun pays that once and every worker that joins the rendezvous pays it again.
# `bench/launcher/launch_time.py` measured `trainrun -np 8 barrier_example` at 114 ms with shared
# libraries and 70 ms with static ones. And the launcher copied onto a host without those
# libraries runs there (scripts/portable-build.sh, tests/install/portable_test.sh). Debian ships
# the .a files next to the .so files, except for spdlog and fmt, which are used header-only
# (trainrun_spdlog below).
#
# How: the executable link rule goes through cmake/link_static_deps.sh, which swaps those
# libraries' .so paths for their .a siblings. Only executables: the shared library
# libtrainrun_collectives.so and the Python extension keep the shared libraries, because Debian
# built its archives as position-independent *executable* code, whose thread-local variables a
# shared object cannot contain; cmake/TrainrunPortable.cmake makes a self-contained library all
# the same, for the portable bundle.
option(TRAINRUN_STATIC_DEPS
       "Link gRPC, Protobuf, Abseil, OpenSSL and libssh2 statically into executables, spdlog and fmt header-only"
       ON)
if(TRAINRUN_STATIC_DEPS AND CMAKE_SYSTEM_NAME STREQUAL "Linux")
  set(CMAKE_CXX_LINK_EXECUTABLE
      "${CMAKE_CURRENT_LIST_DIR}/link_static_deps.sh ${CMAKE_CXX_LINK_EXECUTABLE}")
endif()

# trainrun_spdlog: what the launcher and the CLI link for spdlog. Debian has no libspdlog.a or
# libfmt.a, so with TRAINRUN_STATIC_DEPS both are compiled from their headers into each user
# (spdlog's header-only mode over fmt's; ~6 s more compile time for each of the ~15 files that
# include spdlog), else Debian's shared libspdlog and libfmt.
find_package(spdlog CONFIG REQUIRED)
find_package(fmt CONFIG REQUIRED)
add_library(trainrun_spdlog INTERFACE)
if(TRAINRUN_STATIC_DEPS)
  get_target_property(_trainrun_spdlog_include spdlog::spdlog_header_only
                      INTERFACE_INCLUDE_DIRECTORIES)
  target_include_directories(trainrun_spdlog SYSTEM INTERFACE ${_trainrun_spdlog_include})
  target_compile_definitions(trainrun_spdlog INTERFACE SPDLOG_FMT_EXTERNAL)
  target_link_libraries(trainrun_spdlog INTERFACE fmt::fmt-header-only Threads::Threads)
else()
  target_link_libraries(trainrun_spdlog INTERFACE spdlog::spdlog)
endif()
