"""setup.py: only makes the wheel a platform wheel (py3-none-linux_x86_64...).

The package is pure Python over ctypes, but the wheel that python/build-wheel.sh
builds carries libgmr.so.0 (and libgmr-preload.so) compiled for this
platform, so it must not be tagged "any".  Everything else is in
pyproject.toml.
"""

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
        return "py3", "none", plat  # ctypes: any Python 3, no extension ABI


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True


setup(distclass=BinaryDistribution, cmdclass={"bdist_wheel": PlatformWheel})
