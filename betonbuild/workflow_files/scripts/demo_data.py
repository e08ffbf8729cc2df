import sys

sys.path.append(snakemake.scriptdir + "/../../..")  # --sdm conda: betonbuild from beside us; last: the env wins
from betonbuild.demo import write_digits, write_faces, write_photo_shards, write_photos
from betonbuild.workflow.rulescript import run


def materialise():
    write_digits(snakemake.output.digits)
    write_faces(snakemake.output.faces_images, snakemake.output.faces_labels)
    write_photos(snakemake.output.photos)
    write_photo_shards(snakemake.output.shards)


run(snakemake, materialise)
