"""Write a cut-off `opgen tune` run's winners from its log's timing lines, with tune's own
pick_winners / merged_entries / write_tuned, for the variants every candidate of which was timed
(how run 87's D64 full forward entries were written; `opgen tune` now does this itself when it is
interrupted while timing): python docs/profiling/tune_from_log.py SPEC LOG GPU DATE (fwd, D64)."""
import re, sys, tomllib
from pathlib import Path
import opgen.tune as tn
from opgen.families import FAMILIES
from opgen.spec import read_spec, validate, SpecSource
spec_path, log, gpu, date = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
fam = FAMILIES["attention"].spec
source = read_spec(spec_path)
spec = validate(fam, source)
found = tn.candidates(spec, ["fwd"], None, {64})
by_label = {c.label: c for c in found}
times = {}
for line in log.read_text().splitlines():
    m = re.match(r"  (fwd .*): ([0-9.]+) ms(  \[\d+ s\])?$", line)
    if m and m.group(1) in by_label:
        times[by_label[m.group(1)]] = float(m.group(2))
complete = {v for v in {c.variant for c in found}
            if all(c in times for c in found if c.variant == v)}
print("complete variants:", complete)
winners = {v: c for v, c in tn.pick_winners([c for c in found if c.variant in complete], times).items()}
for v, c in winners.items():
    print("fastest:", c.label, times[c])
comment = f"{tn.MARKER} on {gpu}, {date}"
text = tn.write_tuned(source.text, tn.merged_entries(spec, winners), comment)
validate(fam, SpecSource(source.path, "", tomllib.loads(text), text))
print(tn.unified_diff(source.text, text, source.path))
spec_path.write_text(text)
