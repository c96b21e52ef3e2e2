# Installing trainrun: `cmake --install build [--prefix DIR]` (DESTDIR honoured), the CMake package
# (find_package(trainrun)), pkg-config's trainrun.pc, and the Debian packages (cpack -G DEB,
# scripts/package.sh). Included once, at the end of the top-level CMakeLists.txt.
#
# What goes where (GNUInstallDirs, relative to the prefix):
#
#   bin/trainrun                                  the launcher                      [runtime]
#   libexec/trainrun/trainrun-rank-shim           each rank's supervisor (rank_shim.h) [runtime]
#   <libdir>/libtrainrun_collectives.so.0.1.0     the collectives, C++ and C API    [runtime]
#   <libdir>/libtrainrun_collectives_nccl.so.*    the NCCL backend, where built     [nccl]
#   <python site folder>/trainrun/                the Python package                [python]
#   share/man/man1/trainrun.1.gz, bash and zsh completion (TrainrunReference)     [reference]
#   include/trainrun/{collectives,rendezvous}/    the worker-side headers           [dev]
#   <libdir>/libtrainrun_collectives.{so,a}       link-time name, static archive    [dev]
#   <libdir>/cmake/trainrun/, <libdir>/pkgconfig/trainrun.pc                        [dev]
#
# The installed libraries are bundles: the modules build static archives (trainrun_collectives,
# trainrun_rendezvous, ...) that the build tree links; here each exposed library is made once more
# from those archives, whole, so the installed library needs no other trainrun file. The shared
# library keeps gRPC, Protobuf, Abseil and OpenSSL as shared dependencies (dpkg-shlibdeps names
# them); its headers expose only Abseil's Status, which the package config finds.
#
# Only for trainrun built on its own: a project that adds trainrun with add_subdirectory keeps its
# own install rules and CPack configuration.
if(NOT CMAKE_PROJECT_NAME STREQUAL PROJECT_NAME)
  return()
endif()
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(TRAINRUN_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/trainrun CACHE STRING
    "Where trainrunConfig.cmake is installed, relative to the prefix")
set(TRAINRUN_BASH_COMPLETION_DIR ${CMAKE_INSTALL_DATADIR}/bash-completion/completions CACHE STRING
    "Where bash completion for trainrun is installed, relative to the prefix")
set(TRAINRUN_ZSH_COMPLETION_DIR ${CMAKE_INSTALL_DATADIR}/zsh/vendor-completions CACHE STRING
    "Where zsh completion for trainrun is installed, relative to the prefix (Debian's zsh path)")

# --- The launcher -------------------------------------------------------------------------------
if(TARGET trainrun)
  install(TARGETS trainrun RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT runtime)
  # Found from bin/trainrun as ../libexec/trainrun/trainrun-rank-shim (process_set.cc).
  install(TARGETS trainrun_rank_shim RUNTIME DESTINATION ${CMAKE_INSTALL_LIBEXECDIR}/trainrun
          COMPONENT runtime)
endif()

# --- Libraries ----------------------------------------------------------------------------------
# trainrun_install_bundle(NAME OUTPUT_NAME ARCHIVES a b ... [PUBLIC deps] [PRIVATE deps]) makes
# NAME_shared (lib<OUTPUT_NAME>.so with SONAME and version, holding every object of ARCHIVES) and
# NAME_static (lib<OUTPUT_NAME>.a, the ARCHIVES merged into one).
function(trainrun_install_bundle name)
  cmake_parse_arguments(PARSE_ARGV 1 arg "" "OUTPUT_NAME" "ARCHIVES;PUBLIC;PRIVATE")
  # The shared library: every object of the archives (not just those something refers to), named
  # by file so the archives' own link dependencies (each other, static) do not come along; the
  # dependencies it needs are named here instead (PUBLIC, PRIVATE).
  set(source ${PROJECT_BINARY_DIR}/lib/${name}_bundle.cc)
  file(CONFIGURE OUTPUT ${source}
       CONTENT "// ${name}: the objects of ${arg_ARCHIVES} (cmake/TrainrunInstall.cmake)\n")
  add_library(${name}_shared SHARED ${source})
  set_target_properties(${name}_shared PROPERTIES
    OUTPUT_NAME ${arg_OUTPUT_NAME}
    VERSION ${PROJECT_VERSION}
    SOVERSION ${PROJECT_VERSION_MAJOR}
    LIBRARY_OUTPUT_DIRECTORY ${PROJECT_BINARY_DIR}/lib)
  set(files)
  foreach(archive ${arg_ARCHIVES})
    list(APPEND files $<TARGET_FILE:${archive}>)
  endforeach()
  list(JOIN files " " joined)
  add_dependencies(${name}_shared ${arg_ARCHIVES})
  set_property(TARGET ${name}_shared APPEND PROPERTY LINK_DEPENDS ${files})
  target_link_options(${name}_shared PRIVATE
    "SHELL:-Wl,--whole-archive ${joined} -Wl,--no-whole-archive" LINKER:--no-undefined)
  target_link_libraries(${name}_shared PRIVATE ${arg_PRIVATE} PUBLIC ${arg_PUBLIC})

  # The static archive: ar's MRI script adds every member of each archive.
  set(output ${PROJECT_BINARY_DIR}/lib/lib${arg_OUTPUT_NAME}.a)
  set(script "CREATE ${output}\n")
  foreach(archive ${arg_ARCHIVES})
    string(APPEND script "ADDLIB $<TARGET_FILE:${archive}>\n")
  endforeach()
  string(APPEND script "SAVE\nEND\n")
  file(GENERATE OUTPUT ${PROJECT_BINARY_DIR}/lib/${name}.mri CONTENT "${script}")
  set(depends)
  foreach(archive ${arg_ARCHIVES})
    list(APPEND depends ${archive} $<TARGET_FILE:${archive}>)
  endforeach()
  add_custom_command(OUTPUT ${output}
    COMMAND ${CMAKE_COMMAND} -E rm -f ${output}
    COMMAND ${CMAKE_AR} -M < ${PROJECT_BINARY_DIR}/lib/${name}.mri
    DEPENDS ${depends} ${PROJECT_BINARY_DIR}/lib/${name}.mri
    COMMENT "Merging lib${arg_OUTPUT_NAME}.a" VERBATIM)
  add_custom_target(${name}_static ALL DEPENDS ${output})
endfunction()

if(TARGET trainrun_collectives AND TARGET trainrun_rendezvous)
  find_package(gRPC CONFIG REQUIRED)
  find_package(Protobuf REQUIRED)
  find_package(OpenSSL REQUIRED)

  # trainrun::collectives: the C++ API (communicator.h) and the C API (c_api.h) in one library.
  # The archives, also what the portable library holds (cmake/TrainrunPortable.cmake).
  set(TRAINRUN_COLLECTIVES_ARCHIVES trainrun_collectives trainrun_gpu_loader trainrun_rendezvous
      trainrun_rendezvous_file_store trainrun_rendezvous_proto)
  trainrun_install_bundle(trainrun_collectives
    OUTPUT_NAME trainrun_collectives
    ARCHIVES ${TRAINRUN_COLLECTIVES_ARCHIVES}
    PUBLIC absl::status absl::statusor
    PRIVATE gRPC::grpc++ protobuf::libprotobuf OpenSSL::Crypto absl::str_format
            absl::synchronization absl::strings Threads::Threads ${CMAKE_DL_LIBS})
  set_target_properties(trainrun_collectives_shared PROPERTIES EXPORT_NAME collectives)
  target_include_directories(trainrun_collectives_shared INTERFACE
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/collectives/include>
    $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/rendezvous/include>
    $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
  target_compile_features(trainrun_collectives_shared INTERFACE cxx_std_17)

  # trainrun::collectives_c: the same library, for C programs (c_api.h needs no C++ flags).
  add_library(trainrun_collectives_c INTERFACE)
  set_target_properties(trainrun_collectives_c PROPERTIES EXPORT_NAME collectives_c)
  target_link_libraries(trainrun_collectives_c INTERFACE trainrun_collectives_shared)

  install(TARGETS trainrun_collectives_shared EXPORT trainrunTargets
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT runtime NAMELINK_COMPONENT dev)
  install(TARGETS trainrun_collectives_c EXPORT trainrunTargets)
  install(FILES ${PROJECT_BINARY_DIR}/lib/libtrainrun_collectives.a
          DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT dev)

  # The worker-side headers and what they include.
  install(FILES
    collectives/include/trainrun/collectives/c_api.h
    collectives/include/trainrun/collectives/comm_thread.h
    collectives/include/trainrun/collectives/communicator.h
    collectives/include/trainrun/collectives/errors.h
    collectives/include/trainrun/collectives/runtime.h
    collectives/include/trainrun/collectives/types.h
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/trainrun/collectives COMPONENT dev)
  install(FILES
    rendezvous/include/trainrun/rendezvous/client.h
    rendezvous/include/trainrun/rendezvous/environment.h
    rendezvous/include/trainrun/rendezvous/memory_store.h
    rendezvous/include/trainrun/rendezvous/rank_place.h
    rendezvous/include/trainrun/rendezvous/store.h
    DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/trainrun/rendezvous COMPONENT dev)

  # trainrun::collectives_nccl, where the NCCL backend is built.
  if(TARGET trainrun_collectives_nccl)
    # Their imported targets are local to collectives/nccl; find them again here.
    find_package(CUDAToolkit REQUIRED)
    find_package(NCCL REQUIRED)
    trainrun_install_bundle(trainrun_collectives_nccl
      OUTPUT_NAME trainrun_collectives_nccl
      ARCHIVES trainrun_collectives_nccl trainrun_collectives_nccl_bootstrap
      PUBLIC trainrun_collectives_shared CUDA::toolkit)
    add_dependencies(trainrun_collectives_nccl_static trainrun_collectives_static)
    # It needs libtrainrun_collectives.so.0, installed beside it: found there wherever the prefix.
    set_target_properties(trainrun_collectives_nccl_shared PROPERTIES
      EXPORT_NAME collectives_nccl
      INSTALL_RPATH "$ORIGIN")
    # nccl.h's folder comes from the consumer's own FindNCCL (trainrunConfig.cmake): the library
    # opens libnccl at run time, so only the header is needed to build against it.
    target_include_directories(trainrun_collectives_nccl_shared INTERFACE
      $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}/collectives/nccl/include>
      $<BUILD_INTERFACE:${NCCL_INCLUDE_DIRS}>
      $<INSTALL_INTERFACE:${CMAKE_INSTALL_INCLUDEDIR}>)
    install(TARGETS trainrun_collectives_nccl_shared EXPORT trainrunNcclTargets
      LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT nccl NAMELINK_COMPONENT nccl)
    install(FILES ${PROJECT_BINARY_DIR}/lib/libtrainrun_collectives_nccl.a
            DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT nccl)
    install(DIRECTORY collectives/nccl/include/trainrun/collectives/nccl
            DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/trainrun/collectives COMPONENT nccl)
    install(EXPORT trainrunNcclTargets NAMESPACE trainrun::
            DESTINATION ${TRAINRUN_INSTALL_CMAKEDIR} COMPONENT nccl)
    install(FILES cmake/FindNCCL.cmake DESTINATION ${TRAINRUN_INSTALL_CMAKEDIR} COMPONENT nccl)
  endif()

  # The CMake package.
  install(EXPORT trainrunTargets NAMESPACE trainrun::
          DESTINATION ${TRAINRUN_INSTALL_CMAKEDIR} COMPONENT dev)
  configure_package_config_file(cmake/trainrunConfig.cmake.in
    ${PROJECT_BINARY_DIR}/cmake/trainrunConfig.cmake
    INSTALL_DESTINATION ${TRAINRUN_INSTALL_CMAKEDIR}
    PATH_VARS CMAKE_INSTALL_BINDIR)
  write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/trainrunConfigVersion.cmake
    COMPATIBILITY SameMinorVersion)
  file(RELATIVE_PATH _trainrun_cmake_to_prefix /prefix/${TRAINRUN_INSTALL_CMAKEDIR} /prefix)
  configure_file(cmake/trainrunStaticTargets.cmake.in
    ${PROJECT_BINARY_DIR}/cmake/trainrunStaticTargets.cmake @ONLY)
  install(FILES
    ${PROJECT_BINARY_DIR}/cmake/trainrunConfig.cmake
    ${PROJECT_BINARY_DIR}/cmake/trainrunConfigVersion.cmake
    ${PROJECT_BINARY_DIR}/cmake/trainrunStaticTargets.cmake
    DESTINATION ${TRAINRUN_INSTALL_CMAKEDIR} COMPONENT dev)

  # pkg-config: relocatable (prefix from the .pc file's own place).
  file(RELATIVE_PATH _trainrun_pc_to_prefix
       /prefix/${CMAKE_INSTALL_LIBDIR}/pkgconfig /prefix)
  string(REGEX REPLACE "/$" "" _trainrun_pc_to_prefix "${_trainrun_pc_to_prefix}")
  configure_file(cmake/trainrun.pc.in ${PROJECT_BINARY_DIR}/pkgconfig/trainrun.pc @ONLY)
  install(FILES ${PROJECT_BINARY_DIR}/pkgconfig/trainrun.pc
          DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig COMPONENT dev)
endif()

# --- The Python package -------------------------------------------------------------------------
# Into the interpreter's own site folder under the prefix, chosen when installing (so `--prefix`
# and CPack's /usr count): Debian's python3 reads /usr/lib/python3/dist-packages and
# /usr/local/lib/python3.X/dist-packages; any other prefix gets lib/python3.X/site-packages (for
# PYTHONPATH or a venv). TRAINRUN_PYTHON_INSTALL_DIR (relative to the prefix, or absolute)
# overrides it.
if(TARGET trainrun_python)
  execute_process(
    COMMAND ${TRAINRUN_PYTHON_EXECUTABLE} -c [[
import sysconfig
schemes = sysconfig.get_scheme_names()
def rel(scheme, base):
    path = sysconfig.get_path("platlib", scheme, vars={"base": base, "platbase": base})
    return path[len(base) + 1:] if path.startswith(base + "/") else path
usr = rel("deb_system", "/usr") if "deb_system" in schemes else rel("posix_prefix", "/usr")
local = rel("posix_local", "/usr")[len("local/"):] if "posix_local" in schemes else rel("posix_prefix", "/usr/local")
import sys
print(";".join([usr, local, rel("posix_prefix", "/p"), str(sys.version_info[1])]))
]]
    OUTPUT_VARIABLE _trainrun_site_dirs OUTPUT_STRIP_TRAILING_WHITESPACE RESULT_VARIABLE _rc)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "trainrun: ${TRAINRUN_PYTHON_EXECUTABLE} could not name its site folder")
  endif()
  list(GET _trainrun_site_dirs 0 _trainrun_site_usr)
  list(GET _trainrun_site_dirs 1 _trainrun_site_usr_local)
  list(GET _trainrun_site_dirs 2 _trainrun_site_other)
  list(GET _trainrun_site_dirs 3 TRAINRUN_PYTHON_VERSION_MINOR)
  set(TRAINRUN_PYTHON_SITE_USR ${_trainrun_site_usr})
  install(CODE "
    set(_site \"${_trainrun_site_other}\")
    if(\"${TRAINRUN_PYTHON_INSTALL_DIR}\" STREQUAL \"\")
      if(CMAKE_INSTALL_PREFIX MATCHES \"^/usr/?$\")
        set(_site \"${_trainrun_site_usr}\")
      elseif(CMAKE_INSTALL_PREFIX MATCHES \"^/usr/local/?$\")
        set(_site \"${_trainrun_site_usr_local}\")
      endif()
      set(_site \"\${CMAKE_INSTALL_PREFIX}/\${_site}\")
    elseif(IS_ABSOLUTE \"${TRAINRUN_PYTHON_INSTALL_DIR}\")
      set(_site \"${TRAINRUN_PYTHON_INSTALL_DIR}\")
    else()
      set(_site \"\${CMAKE_INSTALL_PREFIX}/${TRAINRUN_PYTHON_INSTALL_DIR}\")
    endif()
    file(INSTALL \"${TRAINRUN_PYTHONPATH}/trainrun\" DESTINATION \"\${_site}\"
         USE_SOURCE_PERMISSIONS
         PATTERN __pycache__ EXCLUDE PATTERN *.pyc EXCLUDE)
    " COMPONENT python)
endif()

# --- Documentation ------------------------------------------------------------------------------
install(FILES README.md DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT reference)
# The README's links: docs/usage.md (the reference) and docs/performance.md, beside it as in the
# sources.
install(FILES docs/usage.md docs/performance.md DESTINATION ${CMAKE_INSTALL_DOCDIR}/docs
        COMPONENT reference)
if(EXISTS ${PROJECT_SOURCE_DIR}/LICENSE)
  install(FILES LICENSE DESTINATION ${CMAKE_INSTALL_DOCDIR} COMPONENT reference)
endif()

# --- Reference: man page and shell completion, generated from `trainrun --help` ------------------
include(TrainrunReference)

# --- Packages -----------------------------------------------------------------------------------
include(TrainrunPackage)
