# Writes OUT, a C file holding every file in INPUTS (the dashboard, web/) as
# a byte array, plus the table {name, data, size} that api/api_static.c
# serves. Names are the files' base names.
set(body "#include <stddef.h>\n\nstruct api_web_file {\n    const char *name;\n    const char *data;\n    size_t size;\n};\n\n")
set(table "")
set(n 0)
string(REPLACE "|" ";" INPUTS "${INPUTS}")
foreach(f ${INPUTS})
  get_filename_component(name ${f} NAME)
  file(READ ${f} hex HEX)
  file(SIZE ${f} size)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," hex "${hex}")
  string(APPEND body "static const char web_${n}[] = {${hex}0x00};\n")
  string(APPEND table "    {\"${name}\", web_${n}, ${size}},\n")
  math(EXPR n "${n}+1")
endforeach()
string(APPEND body "\nextern const struct api_web_file api_web_files[];\nconst struct api_web_file api_web_files[] = {\n${table}    {NULL, NULL, 0}\n};\n")
file(WRITE ${OUT} "${body}")
