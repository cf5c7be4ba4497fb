#include <criterion/criterion.h>
#include <stdarg.h>
#include <string.h>

#include "tests/helpers/common/text_want.h"

void tw_expect_has(const char *text, ...)
{
    va_list ap;
    va_start(ap, text);
    for (const char *want = va_arg(ap, const char *); want; want = va_arg(ap, const char *))
        cr_assert(text && strstr(text, want), "lacks \"%s\":\n%s", want, text ? text : "(null)");
    va_end(ap);
}
