# cmake -DNM=<nm> -DLIB=<shared library> -DHEADER=<rmsnorm.h> -P check_exports.cmake
#
# Fails unless the library's dynamic symbol table defines exactly the C ABI:
# every function declared RMSNORM_API in HEADER, and nothing else apart from
# the symbols the linker itself adds. A C++ symbol here (rmsnorm::cpu::*, a
# template instantiation, a runtime library's function) would become part of
# the ABI and bind to other copies of the library or the runtime in the process.
cmake_policy(SET CMP0057 NEW)  # if(... IN_LIST ...)

foreach(var NM LIB HEADER)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "check_exports.cmake: -D${var}=... is required")
  endif()
endforeach()

execute_process(COMMAND "${NM}" -D --defined-only "${LIB}"
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "${NM} -D --defined-only ${LIB} failed (${rc}): ${err}")
endif()

set(linker_symbols _init _fini _edata _end __bss_start)
set(exported "")
set(unexpected "")
string(REPLACE "\n" ";" lines "${out}")
foreach(line IN LISTS lines)
  # "<value> <type> <name>[@version]"; absolute symbols may have no value.
  if(NOT line MATCHES "^[0-9A-Fa-f]* *[A-Za-z] +([^ @]+)")
    continue()
  endif()
  set(name "${CMAKE_MATCH_1}")
  if(name MATCHES "^rmsnorm_[A-Za-z0-9_]+$")
    list(APPEND exported "${name}")
  elseif(NOT name IN_LIST linker_symbols)
    list(APPEND unexpected "${name}")
  endif()
endforeach()

file(READ "${HEADER}" header)
string(REGEX MATCHALL "RMSNORM_API[^;(]*[ *](rmsnorm_[A-Za-z0-9_]+) *\\(" decls "${header}")
set(api "")
foreach(decl IN LISTS decls)
  string(REGEX REPLACE ".*[ *](rmsnorm_[A-Za-z0-9_]+) *\\($" "\\1" fn "${decl}")
  list(APPEND api "${fn}")
endforeach()
if(api STREQUAL "")
  message(FATAL_ERROR "no RMSNORM_API declarations found in ${HEADER}")
endif()

set(missing "")
foreach(fn IN LISTS api)
  if(NOT fn IN_LIST exported)
    list(APPEND missing "${fn}")
  endif()
endforeach()
foreach(name IN LISTS exported)
  if(NOT name IN_LIST api)
    list(APPEND unexpected "${name}")
  endif()
endforeach()

list(LENGTH api n_api)
set(problems "")
if(unexpected)
  list(JOIN unexpected "\n  " u)
  string(APPEND problems "exports symbols outside the C ABI:\n  ${u}\n")
endif()
if(missing)
  list(JOIN missing "\n  " m)
  string(APPEND problems "does not export these RMSNORM_API functions of ${HEADER}:\n  ${m}\n")
endif()
if(problems)
  message(FATAL_ERROR "${LIB} ${problems}")
endif()
message(STATUS "${LIB}: exports the ${n_api} RMSNORM_API functions and nothing else")
