"""The merge side: ``betonbuild.beton.merge.merge_betons(PARTS, OUT)`` in a fresh process, as ``rule merge`` runs it.

    merge.py OUT.beton PART.beton...

Prints the merge's own record (its in-process seconds, the copy method) as JSON.
"""

import json
import sys

from betonbuild.beton.merge import merge_betons

record = merge_betons(sys.argv[2:], sys.argv[1])
print(json.dumps({k: record[k] for k in ("seconds", "method", "bytes_copied", "size")}))
