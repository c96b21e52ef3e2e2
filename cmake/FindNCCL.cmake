# FindNCCL: NCCL's header and library. NCCL ships no CMake package config, so this module finds
# nccl.h and libnccl and wraps them in an imported target.
#
#   find_package(NCCL)              # then: target_link_libraries(foo PRIVATE NCCL::NCCL)
#
# Search order: NCCL_ROOT (CMake variable, then environment variable), NCCL_INCLUDE_DIR /
# NCCL_LIBRARY when set in the cache, the CUDA toolkit's directories (CUDAToolkit_INCLUDE_DIRS /
# CUDAToolkit_LIBRARY_DIR, after find_package(CUDAToolkit)), /usr/local/cuda, then system paths.
#
# Sets NCCL_FOUND, NCCL_INCLUDE_DIRS, NCCL_LIBRARIES, NCCL_VERSION (from nccl.h), and the imported
# target NCCL::NCCL. Set NCCL_USE_STATIC=ON to prefer libnccl_static.a.
include(FindPackageHandleStandardArgs)

set(_nccl_hints)
if(DEFINED NCCL_ROOT)
  list(APPEND _nccl_hints ${NCCL_ROOT})
endif()
if(DEFINED ENV{NCCL_ROOT})
  list(APPEND _nccl_hints $ENV{NCCL_ROOT})
endif()
set(_nccl_paths)
if(CUDAToolkit_FOUND)
  list(APPEND _nccl_paths ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_DIR})
  get_filename_component(_nccl_cuda_root "${CUDAToolkit_LIBRARY_DIR}" DIRECTORY)
  list(APPEND _nccl_paths ${_nccl_cuda_root})
endif()
list(APPEND _nccl_paths /usr/local/cuda)

find_path(NCCL_INCLUDE_DIR nccl.h
  HINTS ${_nccl_hints}
  PATHS ${_nccl_paths}
  PATH_SUFFIXES include)

if(NCCL_USE_STATIC)
  set(_nccl_names libnccl_static.a nccl_static nccl)
else()
  set(_nccl_names nccl)
endif()
find_library(NCCL_LIBRARY NAMES ${_nccl_names}
  HINTS ${_nccl_hints}
  PATHS ${_nccl_paths}
  PATH_SUFFIXES lib64 lib lib/x86_64-linux-gnu targets/x86_64-linux/lib)

if(NCCL_INCLUDE_DIR AND EXISTS "${NCCL_INCLUDE_DIR}/nccl.h")
  file(STRINGS "${NCCL_INCLUDE_DIR}/nccl.h" _nccl_version_lines
       REGEX "^#define NCCL_(MAJOR|MINOR|PATCH) +[0-9]+")
  foreach(_part MAJOR MINOR PATCH)
    string(REGEX REPLACE ".*#define NCCL_${_part} +([0-9]+).*" "\\1" NCCL_VERSION_${_part}
           "${_nccl_version_lines}")
  endforeach()
  set(NCCL_VERSION "${NCCL_VERSION_MAJOR}.${NCCL_VERSION_MINOR}.${NCCL_VERSION_PATCH}")
endif()

find_package_handle_standard_args(NCCL
  REQUIRED_VARS NCCL_LIBRARY NCCL_INCLUDE_DIR
  VERSION_VAR NCCL_VERSION)

if(NCCL_FOUND)
  set(NCCL_INCLUDE_DIRS ${NCCL_INCLUDE_DIR})
  set(NCCL_LIBRARIES ${NCCL_LIBRARY})
  if(NOT TARGET NCCL::NCCL)
    add_library(NCCL::NCCL UNKNOWN IMPORTED)
    set_target_properties(NCCL::NCCL PROPERTIES
      IMPORTED_LOCATION "${NCCL_LIBRARY}"
      INTERFACE_INCLUDE_DIRECTORIES "${NCCL_INCLUDE_DIR}")
  endif()
endif()

mark_as_advanced(NCCL_INCLUDE_DIR NCCL_LIBRARY)
unset(_nccl_hints)
unset(_nccl_paths)
unset(_nccl_names)
