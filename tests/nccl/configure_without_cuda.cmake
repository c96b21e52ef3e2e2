# Configures the whole tree with CUDA out of reach and checks that configure succeeds and says, in
# exactly one line, that the NCCL backend is not built. Configure only: building is the CI's job.
#
#   cmake -DSOURCE_DIR=... -DBINARY_DIR=... -DGENERATOR=Ninja -DHIDE=<option> -DEXPECT=<regex>
#         -P configure_without_cuda.cmake
# HIDE is the -D option that hides CUDA (e.g. TRAINRUN_WITH_CUDA=OFF); EXPECT the reason expected.
file(REMOVE_RECURSE "${BINARY_DIR}")
execute_process(
  COMMAND "${CMAKE_COMMAND}" -S "${SOURCE_DIR}" -B "${BINARY_DIR}" -G "${GENERATOR}" "-D${HIDE}"
  RESULT_VARIABLE result
  OUTPUT_VARIABLE output
  ERROR_VARIABLE errors
  TIMEOUT 240)
file(REMOVE_RECURSE "${BINARY_DIR}")
if(NOT result EQUAL 0)
  message(FATAL_ERROR "configure with -D${HIDE} failed (${result}):\n${output}\n${errors}")
endif()
string(REGEX MATCHALL "NCCL backend not built[^\n]*" lines "${output}")
list(LENGTH lines count)
if(NOT count EQUAL 1)
  message(FATAL_ERROR "expected one 'NCCL backend not built' line, found ${count}:\n${output}")
endif()
if(NOT lines MATCHES "${EXPECT}")
  message(FATAL_ERROR "the 'not built' line does not give the reason '${EXPECT}': ${lines}")
endif()
if(output MATCHES "NCCL backend built with")
  message(FATAL_ERROR "configure claims the NCCL backend is built:\n${output}")
endif()
message(STATUS "ok: ${lines}")
