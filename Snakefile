# betonbuild: datasets -> validated FFCV .beton files.
# Stages, in order: source manifest -> smoke .beton -> smoke verification -> full .beton (or its
# parts and their merge) -> verification.


configfile: "config/config.yaml"


report: "report/workflow.rst"


include: "rules/common.smk"
include: "rules/resources.smk"
include: "rules/demo.smk"
include: "rules/sources.smk"
include: "rules/smoke.smk"
include: "rules/write.smk"
include: "rules/partitions.smk"
include: "rules/verify.smk"
include: "rules/report.smk"


localrules:
    all,
    demo_data,
    report_assets,


rule all:
    default_target: True
    input:
        all_outputs(),
