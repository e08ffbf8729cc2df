# This repository's workflow: the packaged one (betonbuild/workflow_files/Snakefile, what
# `betonbuild run` and `pip install` users get) with the demo's config. `snakemake all` here builds
# the demo; `--configfile X` merges X over it (add --replace-workflow-config to build X alone).


configfile: "config/config.yaml"


include: "betonbuild/workflow_files/Snakefile"
