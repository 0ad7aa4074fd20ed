# giftclient_pc.cmake: writes giftclient.pc and installs it, at install time
# (client/CMakeLists.txt's install(CODE) sets the GIFTCLIENT_* variables and
# includes this file), so that the prefix in it is the one installed to.
#
# A program linked with `pkg-config --libs giftclient` against a prefix whose
# library folder is not one the linker searches by itself (--prefix
# $HOME/.local, /opt/giftd, a temporary folder) gets -Wl,-rpath to that
# folder, so that it finds libgiftclient.so.0 without LD_LIBRARY_PATH; for
# /usr nothing is added.
set(GIFTCLIENT_PC_PREFIX "${CMAKE_INSTALL_PREFIX}")
foreach(_dir LIBDIR INCLUDEDIR)
  if(IS_ABSOLUTE "${GIFTCLIENT_${_dir}}")
    set(GIFTCLIENT_PC_${_dir} "${GIFTCLIENT_${_dir}}")
  else()
    set(GIFTCLIENT_PC_${_dir} "\${prefix}/${GIFTCLIENT_${_dir}}")
  endif()
endforeach()
get_filename_component(_giftclient_libdir "${GIFTCLIENT_LIBDIR}" ABSOLUTE
                       BASE_DIR "${CMAKE_INSTALL_PREFIX}")
set(GIFTCLIENT_PC_RPATH "")
list(FIND GIFTCLIENT_SYSTEM_LIBDIRS "${_giftclient_libdir}" _giftclient_system) # no IN_LIST here:
if(_giftclient_system EQUAL -1)                                   # install scripts have no policies
  set(GIFTCLIENT_PC_RPATH "-Wl,-rpath,\${libdir}")
endif()
configure_file("${GIFTCLIENT_PC_IN}" "${GIFTCLIENT_PC_OUT}" @ONLY)
file(INSTALL DESTINATION "${_giftclient_libdir}/pkgconfig" TYPE FILE FILES "${GIFTCLIENT_PC_OUT}")
