# cmake/options.cmake - schema/options.json, the one table of a job's cell
# options, as the C header OUT (options_gen.h): X-macros that
# storage/options.h turns into struct cell_options and its defaults, and
# capctl's help its default words. Run at configure time; re-run when the
# table changes (CMAKE_CONFIGURE_DEPENDS).
#   CAPD_OPTIONS_INT(X)   X(name, min, max, default, "default")
#   CAPD_OPTIONS_ENUM(X)  X(name, "default", "v1|v2|...")
#   CAPD_OPTION_DEFAULT_name "default", CAPD_OPTION_VALUES_name "v1|v2|..."
# An enum value longer than CAPD_OPTION_ENUM_MAX - 1 bytes stops the
# configuration (struct cell_options holds each in a fixed array).
# The index of the last row of KIND ("integer", "enum") of the table in
# the variable named DOC, into LAST.
macro(capd_option_rows doc kind last)
  string(JSON _n LENGTH "${${doc}}" ${kind})
  math(EXPR ${last} "${_n} - 1")
endmacro()

# Row I of KIND: its name into NAME, its default into DEF, then each
# further FIELD VAR pair (min lo max hi) into VAR.
macro(capd_option_get doc kind i name def)
  string(JSON ${name} GET "${${doc}}" ${kind} ${i} name)
  string(JSON ${def} GET "${${doc}}" ${kind} ${i} default)
  set(_rest ${ARGN})
  while(_rest)
    list(POP_FRONT _rest _field _var)
    string(JSON ${_var} GET "${${doc}}" ${kind} ${i} ${_field})
  endwhile()
endmacro()

function(capd_options_header json_path out)
  file(READ ${json_path} doc)
  set(max_enum 32)
  set(ints "")
  set(words "")
  capd_option_rows(doc integer last)
  foreach(i RANGE ${last})
    capd_option_get(doc integer ${i} name def min lo max hi)
    string(APPEND ints "    X(${name}, ${lo}LL, ${hi}LL, ${def}LL, \"${def}\") \\\n")
    string(APPEND words "#define CAPD_OPTION_DEFAULT_${name} \"${def}\"\n")
  endforeach()
  set(enums "")
  capd_option_rows(doc enum last)
  foreach(i RANGE ${last})
    capd_option_get(doc enum ${i} name def)
    string(JSON nv LENGTH "${doc}" enum ${i} values)
    math(EXPR lastv "${nv} - 1")
    set(vals "")
    foreach(v RANGE ${lastv})
      string(JSON val GET "${doc}" enum ${i} values ${v})
      string(LENGTH "${val}" len)
      if(NOT len LESS max_enum)
        message(FATAL_ERROR "${json_path}: option ${name}'s value ${val} is longer than ${max_enum} - 1 bytes")
      endif()
      if(vals)
        string(APPEND vals "|")
      endif()
      string(APPEND vals "${val}")
    endforeach()
    string(APPEND enums "    X(${name}, \"${def}\", \"${vals}\") \\\n")
    string(APPEND words "#define CAPD_OPTION_DEFAULT_${name} \"${def}\"\n")
    string(APPEND words "#define CAPD_OPTION_VALUES_${name} \"${vals}\"\n")
  endforeach()
  set(text "/* Generated from schema/options.json by cmake/options.cmake: do not edit. */\n")
  string(APPEND text "#ifndef CAPD_OPTIONS_GEN_H\n#define CAPD_OPTIONS_GEN_H\n\n")
  string(APPEND text "#define CAPD_OPTION_ENUM_MAX ${max_enum}\n\n")
  string(APPEND text "#define CAPD_OPTIONS_INT(X) \\\n${ints}\n")
  string(APPEND text "#define CAPD_OPTIONS_ENUM(X) \\\n${enums}\n")
  string(APPEND text "/* Each default (and an enum's values) as a string literal, for help text. */\n")
  string(APPEND text "${words}\n#endif\n")
  file(WRITE ${out}.tmp "${text}")
  file(COPY_FILE ${out}.tmp ${out} ONLY_IF_DIFFERENT)
  file(REMOVE ${out}.tmp)
endfunction()
