# SHOAL_CHECK_PKG(name, NAME, header, lib, func, [pkg-config module])
# --with-name[=yes|no|auto|DIR] (default auto). Defines NAME_CPPFLAGS, NAME_LDFLAGS, NAME_LIBS,
# AM_CONDITIONAL(HAVE_NAME), and SHOAL_HAVE_NAME 0 or 1. --with-name given but unusable is an error.
AC_DEFUN([SHOAL_CHECK_PKG], [
    AC_ARG_WITH([$1],
        [AS_HELP_STRING([--with-$1@<:@=yes|no|auto|DIR@:>@], [use $1 (default: auto)])],
        [], [with_$1=auto])
    shoal_have_$1=0
    $2_CPPFLAGS=""
    $2_LDFLAGS=""
    $2_LIBS=""
    AS_IF([test "x$with_$1" != "xno"], [
        shoal_save_CPPFLAGS="$CPPFLAGS"
        shoal_save_LDFLAGS="$LDFLAGS"
        shoal_save_LIBS="$LIBS"
        AS_CASE(["x$with_$1"],
            [xyes|xauto], [
                m4_ifval([$6], [
                    AS_IF([test -n "$PKG_CONFIG" && $PKG_CONFIG --exists $6 2>/dev/null], [
                        $2_CPPFLAGS=`$PKG_CONFIG --cflags $6`
                        $2_LDFLAGS=`$PKG_CONFIG --libs-only-L $6`
                    ])
                ])
            ],
            [
                $2_CPPFLAGS="-I$with_$1/include"
                AS_IF([test -d "$with_$1/lib64"],
                      [$2_LDFLAGS="-L$with_$1/lib64 -Wl,-rpath,$with_$1/lib64"],
                      [$2_LDFLAGS="-L$with_$1/lib -Wl,-rpath,$with_$1/lib"])
            ])
        CPPFLAGS="$CPPFLAGS $$2_CPPFLAGS"
        LDFLAGS="$LDFLAGS $$2_LDFLAGS"
        AS_UNSET([ac_cv_header_]m4_translit([$3], [./-], [___]))
        AC_CHECK_HEADER([$3], [
            AC_CHECK_LIB([$4], [$5], [shoal_have_$1=1; $2_LIBS="-l$4"])
        ])
        CPPFLAGS="$shoal_save_CPPFLAGS"
        LDFLAGS="$shoal_save_LDFLAGS"
        LIBS="$shoal_save_LIBS"
        AS_IF([test "x$with_$1" != "xauto" && test "$shoal_have_$1" = "0"],
              [AC_MSG_ERROR([--with-$1 was given but $1 ($3, -l$4) is not usable])])
    ])
    AS_IF([test "$shoal_have_$1" = "0"], [$2_CPPFLAGS=""; $2_LDFLAGS=""; $2_LIBS=""])
    AC_SUBST([$2_CPPFLAGS])
    AC_SUBST([$2_LDFLAGS])
    AC_SUBST([$2_LIBS])
    AM_CONDITIONAL([HAVE_$2], [test "$shoal_have_$1" = "1"])
    AC_DEFINE_UNQUOTED([SHOAL_HAVE_$2], [$shoal_have_$1], [Define to 1 if $1 is usable])
])
