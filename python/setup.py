"""setup.py: only makes the wheel a manylinux platform wheel.

The package is pure Python over ctypes, but the wheel that python/build-wheel.sh
builds carries libgmr.so.0 (and libgmr-preload.so) compiled for this
platform, so it must not be tagged "any".  Its platform tag is the one
python/manylinux.py computed from what those ELF files need
(manylinux_2_X_x86_64, see Note [Manylinux policy] there), which
build-wheel.sh passes in GMR_WHEEL_PLAT; without it (setup.py run by hand)
the wheel is tagged with the build host's platform (linux_x86_64), which the
Python Package Index refuses.  Everything else is in pyproject.toml.
"""

import os

from setuptools import setup
from setuptools.dist import Distribution

try:
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:  # setuptools < 70
    from wheel.bdist_wheel import bdist_wheel


class PlatformWheel(bdist_wheel):
    def finalize_options(self):
        super().finalize_options()
        self.root_is_pure = False

    def get_tag(self):
        _, _, plat = super().get_tag()
        plat = os.environ.get("GMR_WHEEL_PLAT") or plat
        return "py3", "none", plat  # ctypes: any Python 3, no extension ABI


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(distclass=BinaryDistribution, cmdclass={"bdist_wheel": PlatformWheel})
