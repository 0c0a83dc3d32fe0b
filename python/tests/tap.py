"""Run the unittest modules of a folder and print TAP (one line per test), so
Automake's tap-driver.sh reads them: python3 tap.py DIR"""

import sys
import unittest


class TapResult(unittest.TestResult):
    def __init__(self):
        super().__init__()
        self.n = 0

    def _line(self, test, ok, extra=""):
        self.n += 1
        name = test.id().split(".", 1)[-1]
        print("%s %d - %s%s" % ("ok" if ok else "not ok", self.n, name, extra), flush=True)

    def addSuccess(self, test):
        self._line(test, True)

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._line(test, False)
        self._diag(self.failures[-1][1])

    def addError(self, test, err):
        super().addError(test, err)
        self._line(test, False)
        self._diag(self.errors[-1][1])

    def addSkip(self, test, reason):
        self._line(test, True, " # SKIP %s" % reason)

    @staticmethod
    def _diag(text):
        for line in text.rstrip().splitlines():
            print("# " + line, flush=True)


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "."
    suite = unittest.defaultTestLoader.discover(folder, pattern="test_*.py", top_level_dir=folder)
    result = TapResult()
    suite.run(result)
    print("1..%d" % result.n, flush=True)
    return 0 if result.wasSuccessful() else 1


if __name__ == "__main__":
    sys.exit(main())
