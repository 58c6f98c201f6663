# --enable-sanitizers: build everything with ASan + UBSan (CI's second build).
AC_DEFUN([SHOAL_SANITIZERS], [
    AC_ARG_ENABLE([sanitizers],
        [AS_HELP_STRING([--enable-sanitizers], [build with AddressSanitizer and UBSan])],
        [], [enable_sanitizers=no])
    SHOAL_SAN_CFLAGS=""
    SHOAL_SAN_LDFLAGS=""
    AS_IF([test "x$enable_sanitizers" = "xyes"], [
        SHOAL_SAN_CFLAGS="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined"
        SHOAL_SAN_LDFLAGS="-fsanitize=address,undefined"
    ])
    AC_SUBST([SHOAL_SAN_CFLAGS])
    AC_SUBST([SHOAL_SAN_LDFLAGS])
    AM_CONDITIONAL([SHOAL_SANITIZE], [test "x$enable_sanitizers" = "xyes"])
])
