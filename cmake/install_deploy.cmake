# Runs at install time (cmake --install, make install), when the final
# prefix is known: `cmake --install build --prefix P` may differ from the
# configured CMAKE_INSTALL_PREFIX, and DESTDIR may stage it elsewhere.
#
# - the systemd unit, its paths rewritten for this prefix, to
#   PREFIX/lib/systemd/system/capd.service (systemd reads /usr/lib and
#   /usr/local/lib there);
# - the sysusers entry to PREFIX/lib/sysusers.d/capd.conf;
# - the sample config to SYSCONF/capd/capd.json unless a file is already
#   there (SYSCONF: /etc for the /usr prefix, PREFIX/etc otherwise). It is
#   left out of install_manifest.txt on purpose: uninstalling keeps the
#   operator's configuration, as removing a Debian package keeps conffiles.
#
# Inputs (set by the install(CODE) before this script): CAPD_DEPLOY_DIR,
# CAPD_BINDIR (relative to the prefix), CAPD_STAGE_DIR (a scratch dir in
# the build tree).
set(_prefix "${CMAKE_INSTALL_PREFIX}")
if(_prefix STREQUAL "/usr")
  set(_etc "/etc")
else()
  set(_etc "${_prefix}/etc")
endif()

file(READ "${CAPD_DEPLOY_DIR}/capd.service" _unit)
string(REPLACE "/usr/bin/capd " "${_prefix}/${CAPD_BINDIR}/capd " _unit "${_unit}")
string(REPLACE "/etc/capd/" "${_etc}/capd/" _unit "${_unit}")
string(REPLACE "file:///usr/share/doc/capd/" "file://${_prefix}/share/doc/capd/" _unit "${_unit}")
file(MAKE_DIRECTORY "${CAPD_STAGE_DIR}")
file(WRITE "${CAPD_STAGE_DIR}/capd.service" "${_unit}")
file(INSTALL DESTINATION "${_prefix}/lib/systemd/system" TYPE FILE
     FILES "${CAPD_STAGE_DIR}/capd.service")
file(INSTALL DESTINATION "${_prefix}/lib/sysusers.d" TYPE FILE
     RENAME capd.conf FILES "${CAPD_DEPLOY_DIR}/capd.sysusers")

set(_conf "$ENV{DESTDIR}${_etc}/capd/capd.json")
if(EXISTS "${_conf}")
  message(STATUS "Keeping: ${_conf}")
else()
  message(STATUS "Installing: ${_conf}")
  file(MAKE_DIRECTORY "$ENV{DESTDIR}${_etc}/capd")
  file(COPY "${CAPD_DEPLOY_DIR}/capd.json" DESTINATION "$ENV{DESTDIR}${_etc}/capd"
       FILE_PERMISSIONS OWNER_READ OWNER_WRITE GROUP_READ WORLD_READ)
endif()
