"""The host's wall clock, as a microVM sees it through its RTC.

A microVM whose QEMU was stopped or starved on the host comes back with its own clock behind the host's (its
kernel lost the ticks), so a request's expiry, stamped by the host, would look fresh. QEMU's RTC reads the host's
clock whenever it is asked, whether or not the guest ran: to the second, which is enough to know a request is
late. gVisor has no RTC (its clock is the host's already): None there.
"""

from __future__ import annotations

RTC_SECONDS = "/sys/class/rtc/rtc0/since_epoch"  # read from the RTC itself at each read (no /dev node needed)
_missing = False


def host_seconds() -> int | None:
    """The host's time in whole seconds since the epoch, or None where there is no RTC to ask."""
    global _missing
    if _missing:
        return None
    try:
        with open(RTC_SECONDS, "rb") as rtc:
            return int(rtc.read().strip())
    except (FileNotFoundError, NotADirectoryError):
        _missing = True  # gVisor, or a kernel without one: never asked again
    except (OSError, ValueError):
        pass  # this once (out of descriptors, a bad read): asked again next time
    return None
