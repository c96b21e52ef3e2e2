# trainrun_warnings: a private INTERFACE target that every project target links, so warnings are
# set per target rather than through CMAKE_CXX_FLAGS.
add_library(trainrun_warnings INTERFACE)
target_compile_options(trainrun_warnings INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic>
  # GCC's spelling; clang (the fuzz and sanitizer builds) has no -Wshadow=local.
  $<$<AND:$<COMPILE_LANGUAGE:CXX>,$<CXX_COMPILER_ID:GNU>>:-Wshadow=local>
  $<$<COMPILE_LANGUAGE:CXX>:-Wno-unused-parameter>
  $<$<COMPILE_LANGUAGE:C>:-Wall -Wextra>)
