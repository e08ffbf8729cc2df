# betonbuild: datasets -> validated FFCV .beton files.
# Stages, in order: source manifest -> smoke .beton -> smoke verification -> full .beton -> verification.


configfile: "config/config.yaml"


include: "rules/common.smk"
include: "rules/resources.smk"
include: "rules/demo.smk"
include: "rules/sources.smk"
include: "rules/smoke.smk"
include: "rules/write.smk"
include: "rules/verify.smk"


localrules:
    all,
    demo_data,


rule all:
    default_target: True
    input:
        all_outputs(),
