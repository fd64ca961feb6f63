#!/usr/bin/env python3
"""Prints the suite's closing line, "N passed, N failed[, N skipped]".

Reads meson's test logs (testlog.json: one JSON object per line, one per test
executable) and pytest's JUnit XML (one entry per test case). Missing files
are ignored. Uses only the standard library.
"""
import json
import sys
import xml.etree.ElementTree as ET

passed = failed = skipped = 0
for path in sys.argv[1:]:
    try:
        if path.endswith(".json"):
            with open(path) as f:
                for line in f:
                    line = line.strip().strip("\x00")
                    if not line:
                        continue
                    try:
                        r = json.loads(line).get("result", "")
                    except ValueError:
                        continue  # a torn line (concurrent runs): not a test
                    if r in ("OK", "EXPECTEDFAIL"):
                        passed += 1
                    elif r == "SKIP":
                        skipped += 1
                    else:
                        failed += 1
        elif path.endswith(".xml"):
            root = ET.parse(path).getroot()
            suites = [root] if root.tag == "testsuite" else list(root)
            for s in suites:
                tests = int(s.get("tests", 0))
                f = int(s.get("failures", 0)) + int(s.get("errors", 0))
                sk = int(s.get("skipped", 0))
                passed += tests - f - sk
                failed += f
                skipped += sk
    except FileNotFoundError:
        pass
line = f"{passed} passed, {failed} failed"
if skipped:
    line += f", {skipped} skipped"
print(line)
