# Debian packages (CPack's DEB generator; scripts/package.sh runs it):
#
#   trainrun        the launcher, libtrainrun_collectives.so.0, the Python package (for Debian's
#                   /usr/bin/python3), the man page and shell completion
#   trainrun-dev    headers, libtrainrun_collectives.{so,a}, the CMake package and trainrun.pc
#   trainrun-nccl   the NCCL backend (only where it was built; it opens CUDA's runtime and NCCL
#                   from NVIDIA's packages or wheels at run time, so it depends on neither)
#
# Depends are computed by dpkg-shlibdeps from the libraries the binaries actually link.
set(CPACK_PACKAGE_NAME trainrun)
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(TRAINRUN_PACKAGE_MAINTAINER "trainrun developers <trainrun@localhost>" CACHE STRING
    "The Maintainer field of the Debian packages")
set(CPACK_PACKAGE_CONTACT ${TRAINRUN_PACKAGE_MAINTAINER})
set(CPACK_GENERATOR DEB)
# Install with prefix /usr into a staging DESTDIR, whatever the build's CMAKE_INSTALL_PREFIX: the
# Python folder is chosen from the prefix when installing (cmake/TrainrunInstall.cmake).
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX /usr)
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_STRIP_FILES ON)
set(CPACK_DEB_COMPONENT_INSTALL ON)
set(CPACK_COMPONENTS_GROUPING ONE_PER_GROUP)
set(CPACK_COMPONENTS_ALL runtime python reference dev)
if(TARGET trainrun_collectives_nccl_shared)
  list(APPEND CPACK_COMPONENTS_ALL nccl)
endif()
foreach(component runtime python reference)
  string(TOUPPER ${component} upper)
  set(CPACK_COMPONENT_${upper}_GROUP trainrun)
endforeach()
set(CPACK_COMPONENT_DEV_GROUP dev)
set(CPACK_COMPONENT_NCCL_GROUP nccl)

set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_PRIORITY optional)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS ON)
set(CPACK_DEBIAN_PACKAGE_GENERATE_SHLIBS_POLICY ">=")

set(CPACK_DEBIAN_TRAINRUN_PACKAGE_NAME trainrun)
string(CONCAT CPACK_DEBIAN_TRAINRUN_DESCRIPTION
  "launcher and process supervisor for distributed training\n"
  "trainrun -np 8 -H host1:4,host2:4 python3 train.py starts one worker per slot, streams their\n"
  "output, runs the rendezvous and ends the job at the first failure with one summary. Includes\n"
  "the collectives library (allreduce, broadcast, allgather over TCP and shared memory) and\n"
  "its Python package with Horovod's PyTorch API (import trainrun.torch).")
if(DEFINED TRAINRUN_PYTHON_VERSION_MINOR)
  # The extension is built for one interpreter version.
  math(EXPR _trainrun_py_next "${TRAINRUN_PYTHON_VERSION_MINOR} + 1")
  set(CPACK_DEBIAN_TRAINRUN_PACKAGE_DEPENDS
      "python3 (>= 3.${TRAINRUN_PYTHON_VERSION_MINOR}), python3 (<< 3.${_trainrun_py_next})")
  set(CPACK_DEBIAN_TRAINRUN_PACKAGE_RECOMMENDS python3-numpy)
  set(CPACK_DEBIAN_TRAINRUN_PACKAGE_SUGGESTS python3-torch)
  configure_file(${PROJECT_SOURCE_DIR}/cmake/debian/prerm.in
                 ${PROJECT_BINARY_DIR}/debian/trainrun/prerm @ONLY)
  file(CHMOD ${PROJECT_BINARY_DIR}/debian/trainrun/prerm PERMISSIONS
       OWNER_READ OWNER_WRITE OWNER_EXECUTE GROUP_READ GROUP_EXECUTE WORLD_READ WORLD_EXECUTE)
  set(CPACK_DEBIAN_TRAINRUN_PACKAGE_CONTROL_EXTRA ${PROJECT_BINARY_DIR}/debian/trainrun/prerm)
endif()

set(CPACK_DEBIAN_DEV_PACKAGE_NAME trainrun-dev)
set(CPACK_DEBIAN_DEV_PACKAGE_SECTION libdevel)
set(CPACK_DEBIAN_DEV_PACKAGE_DEPENDS "trainrun (= ${PROJECT_VERSION}), libabsl-dev")
string(CONCAT CPACK_DEBIAN_DEV_DESCRIPTION
  "trainrun's collectives library: headers, CMake package, pkg-config\n"
  "find_package(trainrun) then target_link_libraries(app trainrun::collectives), or\n"
  "pkg-config --cflags --libs trainrun. Also the static archive.")

set(CPACK_DEBIAN_NCCL_PACKAGE_NAME trainrun-nccl)
set(CPACK_DEBIAN_NCCL_PACKAGE_SHLIBDEPS OFF)
set(CPACK_DEBIAN_NCCL_PACKAGE_DEPENDS "trainrun-dev (= ${PROJECT_VERSION})")
string(CONCAT CPACK_DEBIAN_NCCL_DESCRIPTION
  "trainrun's NCCL backend (trainrun::collectives_nccl)\n"
  "Opens the CUDA runtime and NCCL (2.14 or later) at run time: NVIDIA's packages, the\n"
  "nvidia-* Python wheels or TRAINRUN_NCCL_LIBRARY; nothing of them is linked.")

include(CPack)
