// A plate's shards from Nextflow (DSL2): the plate-wide steps once, the
// shards as one scheduler array (`array`, Nextflow >= 24.04), then the
// finalize. Each task is idempotent: a resumed or retried shard skips its
// complete wells. Not run in CI (no Nextflow there); the commands are the ones
// crates/hcsflow-cli/tests/it/shards.rs tests.
//   nextflow run examples/cluster/main.nf --plate /data/plate --pipeline /data/p.toml --out /scratch/out --shards 8
params.plate = null
params.pipeline = null
params.out = null
params.shards = 8
params.run_flags = '--device cpu --workers 2'

process PLATE_STEPS {
    output:
    val 'ready'

    script:
    """
    hcsflow run ${params.plate} ${params.pipeline} ${params.out} --plate-steps-only ${params.run_flags}
    """
}

process SHARD {
    array 8
    tag "shard ${i}/${params.shards}"

    input:
    val i

    output:
    val i

    script:
    """
    hcsflow run ${params.plate} ${params.pipeline} ${params.out} --shard ${i}/${params.shards} ${params.run_flags}
    """
}

process FINALIZE {
    input:
    val shards

    script:
    """
    hcsflow run ${params.plate} ${params.pipeline} ${params.out} --finalize ${params.run_flags}
    """
}

workflow {
    ready = PLATE_STEPS()
    shards = ready.combine(Channel.of(1..params.shards)).map { it[1] }
    FINALIZE(SHARD(shards).collect())
}
