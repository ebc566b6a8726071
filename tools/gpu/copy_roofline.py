"""The copy bandwidth cuda_roofline measured in a call (WORK/roofline.log), which the *_summary.py
scripts state their figures against."""
import os
import re


def copy_tbs(work):
    """Read+write TB/s of the device-to-device copy, or None when the call did not measure it."""
    log = os.path.join(work, "roofline.log")
    if not os.path.exists(log):
        return None
    m = re.search(r"= ([\d.]+) TB/s read\+write", open(log).read())
    return float(m.group(1)) if m else None
