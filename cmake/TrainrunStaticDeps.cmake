# Executables link gRPC, Protobuf, Abseil, OpenSSL and their dependencies from their static
# archives (option TRAINRUN_STATIC_DEPS, ON by default).
#
# Why: a process that loads them as shared libraries spends ~10 ms resolving ~60 libraries before
# main(); trainrun pays that once and every worker that joins the rendezvous pays it again.
# `bench/launcher/launch_time.py` measured `trainrun -np 8 barrier_example` at 114 ms with shared
# libraries and 70 ms with static ones. Debian ships the .a files next to the .so files.
#
# How: the executable link rule goes through cmake/link_static_deps.sh, which swaps those
# libraries' .so paths for their .a siblings. Only executables: shared objects (the Python
# extension) keep the shared libraries, because Debian's static Abseil uses a TLS model that a
# shared object cannot contain, and the process may load PyTorch's libprotobuf.so anyway.
option(TRAINRUN_STATIC_DEPS "Link gRPC, Protobuf, Abseil and OpenSSL statically into executables"
       ON)
if(TRAINRUN_STATIC_DEPS AND CMAKE_SYSTEM_NAME STREQUAL "Linux")
  set(CMAKE_CXX_LINK_EXECUTABLE
      "${CMAKE_CURRENT_LIST_DIR}/link_static_deps.sh ${CMAKE_CXX_LINK_EXECUTABLE}")
endif()
