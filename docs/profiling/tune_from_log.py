"""Write a cut-off `opgen tune` run's winners from its log's timing lines, with tune's own
pick_winners / merged_entries / write_tuned, for the variants every candidate of which was timed
(how run 87's D64 full forward entries were written; `opgen tune` now does this itself when it is
interrupted while timing):

    python docs/profiling/tune_from_log.py SPEC LOG GPU DATE [PHASE] [HEAD_DIM] [--partial]

PHASE defaults to fwd, HEAD_DIM to 64. --partial also writes a variant whose timing was cut off,
from the candidates it timed, and lists the untimed ones (run 94's D128 causal forward: every
128-row candidate timed, the 192-row ones on 384 threads not)."""
import re, sys, tomllib
from pathlib import Path
import opgen.tune as tn
from opgen.families import FAMILIES
from opgen.spec import read_spec, validate, SpecSource
args = [a for a in sys.argv[1:] if a != "--partial"]
partial = "--partial" in sys.argv
spec_path, log, gpu, date = Path(args[0]), Path(args[1]), args[2], args[3]
phase = args[4] if len(args) > 4 else "fwd"
dim = int(args[5]) if len(args) > 5 else 64
fam = FAMILIES["attention"].spec
source = read_spec(spec_path)
spec = validate(fam, source)
found = tn.candidates(spec, [phase], None, {dim})
by_label = {c.label: c for c in found}
times = {}
for line in log.read_text().splitlines():
    m = re.match(r"  ((?:fwd|bwd) .*): ([0-9.]+) ms(  \[\d+ s\])?$", line)
    if m and m.group(1) in by_label:
        times[by_label[m.group(1)]] = float(m.group(2))
complete = {c.variant for c in found} if partial else tn.timed_variants(found, times)
print("variants written:", complete)
for c in found:
    if c.variant in complete and c not in times:
        print("  not timed:", c.label)
winners = tn.pick_winners([c for c in found if c.variant in complete], times)
for v, c in winners.items():
    print("fastest:", c.label, times[c])
comment = f"{tn.MARKER} on {gpu}, {date}"
text = tn.write_tuned(source.text, tn.merged_entries(spec, winners), comment)
validate(fam, SpecSource(source.path, "", tomllib.loads(text), text))
print(tn.unified_diff(source.text, text, source.path))
spec_path.write_text(text)
