"""One module per experiment (a section of Xu et al. 2023, or a new ablation): its jobs, each a plain function
`job(j: knnlm.job.Job) -> dict` called by `python -m knnlm <module>.<job>`, and its tables and figures."""
