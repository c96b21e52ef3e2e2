# trainrun's reference a user keeps: the man page trainrun(1) and bash and zsh completion, made at
# build time from `trainrun --help` (and README.md's opening and docs/usage.md's paragraphs on
# output, failures and the environment) by cmake/gen_reference.py, so a flag added to the CLI reaches all three without
# editing. Outputs land in build/share/ (man -l build/share/man/man1/trainrun.1) and are installed
# with the `reference` component.
if(NOT TARGET trainrun)
  return()
endif()
if(DEFINED TRAINRUN_PYTHON_EXECUTABLE)
  set(_trainrun_reference_python ${TRAINRUN_PYTHON_EXECUTABLE})
else()
  find_package(Python3 COMPONENTS Interpreter)
  if(NOT Python3_FOUND)
    message(STATUS "trainrun: no python3; the man page and shell completion are not generated")
    return()
  endif()
  set(_trainrun_reference_python ${Python3_EXECUTABLE})
endif()

set(_share ${PROJECT_BINARY_DIR}/share)
set(TRAINRUN_MAN_PAGE ${_share}/man/man1/trainrun.1 CACHE INTERNAL "")
set(TRAINRUN_BASH_COMPLETION ${_share}/bash-completion/completions/trainrun CACHE INTERNAL "")
set(TRAINRUN_ZSH_COMPLETION ${_share}/zsh/vendor-completions/_trainrun CACHE INTERNAL "")
add_custom_command(
  OUTPUT ${TRAINRUN_MAN_PAGE} ${TRAINRUN_MAN_PAGE}.gz ${TRAINRUN_BASH_COMPLETION}
         ${TRAINRUN_ZSH_COMPLETION}
  COMMAND ${CMAKE_COMMAND} -E make_directory ${_share}/man/man1
          ${_share}/bash-completion/completions ${_share}/zsh/vendor-completions
  COMMAND ${_trainrun_reference_python} ${PROJECT_SOURCE_DIR}/cmake/gen_reference.py
          --trainrun $<TARGET_FILE:trainrun> --readme ${PROJECT_SOURCE_DIR}/README.md
          --reference ${PROJECT_SOURCE_DIR}/docs/usage.md
          --version ${PROJECT_VERSION} --man ${TRAINRUN_MAN_PAGE}
          --bash ${TRAINRUN_BASH_COMPLETION} --zsh ${TRAINRUN_ZSH_COMPLETION}
  DEPENDS trainrun ${PROJECT_SOURCE_DIR}/cmake/gen_reference.py ${PROJECT_SOURCE_DIR}/README.md
          ${PROJECT_SOURCE_DIR}/docs/usage.md
  COMMENT "Generating trainrun(1) and bash/zsh completion from trainrun --help"
  VERBATIM)
add_custom_target(trainrun_reference ALL
  DEPENDS ${TRAINRUN_MAN_PAGE} ${TRAINRUN_BASH_COMPLETION} ${TRAINRUN_ZSH_COMPLETION})

install(FILES ${TRAINRUN_MAN_PAGE}.gz DESTINATION ${CMAKE_INSTALL_MANDIR}/man1 COMPONENT reference)
install(FILES ${TRAINRUN_BASH_COMPLETION} DESTINATION ${TRAINRUN_BASH_COMPLETION_DIR}
        COMPONENT reference)
install(FILES ${TRAINRUN_ZSH_COMPLETION} DESTINATION ${TRAINRUN_ZSH_COMPLETION_DIR}
        COMPONENT reference)
