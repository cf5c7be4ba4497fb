# Writes OUT, a C file holding every file in INPUTS ("|"-separated) as a
# NUL-terminated byte array, plus the table TABLE of struct STRUCT
# {name, data, size}, ended by a NULL name. Names are the files' base
# names. HEADER, when given, declares the struct and the table
# (storage/embedded.h); without it the file declares both itself (the
# dashboard's, which api/api_static.c serves).
if(HEADER)
  set(body "#include <stddef.h>\n#include \"${HEADER}\"\n\n")
else()
  set(body "#include <stddef.h>\n\nstruct ${STRUCT} {\n    const char *name;\n    const char *data;\n    size_t size;\n};\n\nextern const struct ${STRUCT} ${TABLE}[];\n\n")
endif()
set(table "")
set(n 0)
string(REPLACE "|" ";" INPUTS "${INPUTS}")
foreach(f ${INPUTS})
  get_filename_component(name ${f} NAME)
  file(READ ${f} hex HEX)
  file(SIZE ${f} size)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," hex "${hex}")
  string(APPEND body "static const char emb_${n}[] = {${hex}0x00};\n")
  string(APPEND table "    {\"${name}\", emb_${n}, ${size}},\n")
  math(EXPR n "${n}+1")
endforeach()
string(APPEND body "\nconst struct ${STRUCT} ${TABLE}[] = {\n${table}    {NULL, NULL, 0}\n};\n")
file(WRITE ${OUT} "${body}")
