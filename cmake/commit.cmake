# Writes OUT, the header that gives the binaries the commit they report
# (`#define NB_GIT_COMMIT "..."`): $NB_GIT_COMMIT when set (a copy of the
# tree whose .git is absent or not the tree's), else `git rev-parse` in
# SRC ("-dirty" after it when tracked files differ from it), else
# "unknown".  Run at every build (the nb_commit target), it
# rewrites OUT only when the commit changed, so nothing recompiles
# otherwise and an incremental build never reports an older commit.
if(DEFINED ENV{NB_GIT_COMMIT})
  set(c "$ENV{NB_GIT_COMMIT}")
else()
  execute_process(COMMAND git rev-parse --short=12 HEAD WORKING_DIRECTORY "${SRC}"
                  OUTPUT_VARIABLE c OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET)
  # tracked files that differ from that commit: "-dirty" (the binaries are not that commit's)
  execute_process(COMMAND git diff --quiet HEAD -- WORKING_DIRECTORY "${SRC}" RESULT_VARIABLE d ERROR_QUIET)
  if(c AND d EQUAL 1)
    set(c "${c}-dirty")
  endif()
endif()
if(NOT c)
  set(c "unknown")
endif()
set(text "#define NB_GIT_COMMIT \"${c}\"\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
