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
            SHOAL_SAN_LDFLAGS="-fsanitize=thread"],
        [no], [],
        [AC_MSG_ERROR([--enable-sanitizers=$enable_sanitizers: expected yes, address or thread])])
    AC_SUBST([SHOAL_SAN_CFLAGS])
    AC_SUBST([SHOAL_SAN_LDFLAGS])
    AM_CONDITIONAL([SHOAL_SANITIZE], [test "x$enable_sanitizers" != "xno"])
])
