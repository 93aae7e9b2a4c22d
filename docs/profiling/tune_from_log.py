"""Write an `opgen tune` run's winners from its log's timing lines, with tune's own
pick_winners / merged_entries / write_tuned (any family with a tuner; every phase and key the
spec's candidates have), for the variants every candidate of which was timed:

    python docs/profiling/tune_from_log.py SPEC LOG GPU DATE [--partial] [--min-speedup X]

How run 87's D64 full forward entries were written from a cut-off run, and run 114's rmsnorm
entries again under --min-speedup once that rule existed. --partial also writes a variant whose
timing was cut off, from the candidates it timed, and lists the untimed ones."""
import re
import sys
import tomllib
from pathlib import Path

import opgen.tune as tn
from opgen.families import FAMILIES
from opgen.spec import SpecSource, read_spec, validate

argv = sys.argv[1:]
partial = "--partial" in argv
min_speedup = 1.0
if "--min-speedup" in argv:
    at = argv.index("--min-speedup")
    min_speedup = float(argv[at + 1])
    del argv[at:at + 2]
spec_path, log, gpu, date = (a for a in argv if a != "--partial")
spec_path, log = Path(spec_path), Path(log)
source = read_spec(spec_path)
family = FAMILIES[tomllib.loads(source.text)["family"]]
spec = validate(family.spec, source)
tuner = family.tuner()
found = tn.candidates(spec)
by_label = {c.label: c for c in found}
times = {}
for line in log.read_text().splitlines():
    # A run-off's line (" ms (run-off, best of 4)") comes later and holds the candidate's best.
    m = re.match(r"  ((?:fwd|bwd) .*): ([0-9.]+) ms( \([^)]*\))?(  \[\d+ s\])?$", line)
    if m and m.group(1) in by_label:
        times[by_label[m.group(1)]] = float(m.group(2))
complete = {c.variant for c in found if c in times} if partial else tn.timed_variants(
    [c for c in found if c.variant in {v.variant for v in times}], times)
timed = [c for c in found if c.variant in complete]
for c in timed:
    if c not in times:
        print("  not timed:", c.label)
for line in tn.winner_lines(timed, times, min_speedup):
    print(line)
winners = tn.pick_winners(timed, times, min_speedup)
text = tn.write_tuned(source.text, tuner, tn.merged_entries(spec, winners),
                      tn.stamps_of(winners.values(), f"on {gpu}, {date}"))
validate(family.spec, SpecSource(source.path, "", tomllib.loads(text), text))
print(tn.unified_diff(source.text, text, source.path))
spec_path.write_text(text)
