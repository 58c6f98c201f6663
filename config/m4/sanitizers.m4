# --enable-sanitizers[=yes|address|thread]: yes (or address) builds everything with ASan +
# UBSan (CI's second build); thread builds with ThreadSanitizer (CI's third build, which runs
# the multi-threaded tests; the two cannot be combined).
AC_DEFUN([SHOAL_SANITIZERS], [
    AC_ARG_ENABLE([sanitizers],
        [AS_HELP_STRING([--enable-sanitizers@<:@=address|thread@:>@],
                        [build with AddressSanitizer and UBSan (yes, address), or with
                         ThreadSanitizer (thread)])],
        [], [enable_sanitizers=no])
    SHOAL_SAN_CFLAGS=""
    SHOAL_SAN_LDFLAGS=""
    AS_CASE([$enable_sanitizers],
        [yes|address], [
            enable_sanitizers=address
            SHOAL_SAN_CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
            SHOAL_SAN_LDFLAGS="-fsanitize=address,undefined"],
        [thread], [
            SHOAL_SAN_CFLAGS="-fsanitize=thread -fno-omit-frame-pointer"
            SHOAL_SAN_LDFLAGS="-fsanitize=thread"
            # TSan does not model a standalone fence, and GCC 12+ says so at each one
            # (-Wtsan: 24 warnings). The protocols ordered by fences (the meter page's and
            # the QoS page's sequence counters, shm's flag handshakes, ib's memory hook) are
            # the part TSan cannot judge: their tests are the exactness and stress tests of
            # the release and ASan builds. The warning is turned off where the compiler has it.
            shoal_save_CFLAGS=$CFLAGS
            CFLAGS="$CFLAGS -Werror -Wtsan"
            AC_COMPILE_IFELSE([AC_LANG_PROGRAM([], [])],
                              [SHOAL_SAN_CFLAGS="$SHOAL_SAN_CFLAGS -Wno-tsan"])
            CFLAGS=$shoal_save_CFLAGS],
        [no], [],
        [AC_MSG_ERROR([--enable-sanitizers=$enable_sanitizers: expected yes, address or thread])])
    AC_SUBST([SHOAL_SAN_CFLAGS])
    AC_SUBST([SHOAL_SAN_LDFLAGS])
    AM_CONDITIONAL([SHOAL_SANITIZE], [test "x$enable_sanitizers" != "xno"])
])
