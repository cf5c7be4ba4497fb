# Removes what an install wrote, from its manifest:
#   cmake -DMANIFEST=build/install_manifest.txt -P cmake/uninstall.cmake
# (also `cmake --build build --target uninstall`). Honours DESTDIR like the
# install did. Directories are removed when they are left empty and are
# capd's own (a path component named capd, or lib/systemd/system and
# lib/sysusers.d are never removed). The config in etc/capd/ was never in
# the manifest, so it stays.
if(NOT MANIFEST OR NOT EXISTS "${MANIFEST}")
  message(FATAL_ERROR "no install manifest at '${MANIFEST}' (install first)")
endif()
file(STRINGS "${MANIFEST}" _files)
set(_dirs "")
foreach(_f IN LISTS _files)
  set(_p "$ENV{DESTDIR}${_f}")
  if(EXISTS "${_p}" OR IS_SYMLINK "${_p}")
    message(STATUS "Removing: ${_p}")
    file(REMOVE "${_p}")
  endif()
  get_filename_component(_d "${_p}" DIRECTORY)
  while(_d MATCHES "/capd(/|$)")
    list(APPEND _dirs "${_d}")
    get_filename_component(_d "${_d}" DIRECTORY)
  endwhile()
endforeach()
list(REMOVE_DUPLICATES _dirs)
# Deepest first, so a parent is empty once its children are gone.
set(_sorted "")
foreach(_d IN LISTS _dirs)
  string(LENGTH "${_d}" _n)
  string(LENGTH "0000000000${_n}" _w)
  math(EXPR _cut "${_w} - 10")
  string(SUBSTRING "0000000000${_n}" ${_cut} 10 _key)
  list(APPEND _sorted "${_key}|${_d}")
endforeach()
list(SORT _sorted ORDER DESCENDING)
foreach(_e IN LISTS _sorted)
  string(REGEX REPLACE "^[0-9]+\\|" "" _d "${_e}")
  file(GLOB _left "${_d}/*" "${_d}/.*")
  if(IS_DIRECTORY "${_d}" AND NOT _left)
    file(REMOVE_RECURSE "${_d}")
  endif()
endforeach()
