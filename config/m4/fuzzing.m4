# --enable-fuzzing: build the libFuzzer targets in tests/fuzz (needs clang and its
# compiler-rt: Debian's libclang-rt-<N>-dev). Every object, the library's included, gets
# coverage instrumentation (-fsanitize=fuzzer-no-link) with ASan and UBSan (UBSan findings
# abort, so libFuzzer records them as crashes); the targets link -fsanitize=fuzzer.
AC_DEFUN([SHOAL_FUZZING], [
    AC_ARG_ENABLE([fuzzing],
        [AS_HELP_STRING([--enable-fuzzing], [build the libFuzzer targets (clang) with ASan and UBSan])],
        [], [enable_fuzzing=no])
    AS_IF([test "x$enable_fuzzing" = "xyes"], [
        AS_IF([test "x$enable_sanitizers" != "xno" && test "x$enable_sanitizers" != "xyes"],
              [AC_MSG_ERROR([--enable-fuzzing builds with ASan and UBSan: it cannot be combined with --enable-sanitizers=$enable_sanitizers])])
        shoal_fuzz_flags="-fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
        AC_MSG_CHECKING([whether $CC links libFuzzer targets])
        shoal_save_CFLAGS="$CFLAGS"
        shoal_save_LDFLAGS="$LDFLAGS"
        CFLAGS="$CFLAGS -fsanitize=fuzzer,address,undefined"
        LDFLAGS="$LDFLAGS -fsanitize=fuzzer,address,undefined"
        AC_LINK_IFELSE([AC_LANG_SOURCE([[
#include <stddef.h>
#include <stdint.h>
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) { return data == NULL && size > 0; }
]])], [shoal_fuzz_ok=yes], [shoal_fuzz_ok=no])
        CFLAGS="$shoal_save_CFLAGS"
        LDFLAGS="$shoal_save_LDFLAGS"
        AC_MSG_RESULT([$shoal_fuzz_ok])
        AS_IF([test "$shoal_fuzz_ok" != "yes"],
              [AC_MSG_ERROR([--enable-fuzzing needs clang with libFuzzer (CC=clang; Debian: libclang-rt-dev)])])
        # Replaces the plain sanitizer flags (the same sanitizers, plus coverage).
        SHOAL_SAN_CFLAGS="$shoal_fuzz_flags"
        SHOAL_SAN_LDFLAGS="-fsanitize=address,undefined"
    ])
    AM_CONDITIONAL([SHOAL_FUZZING], [test "x$enable_fuzzing" = "xyes"])
])
