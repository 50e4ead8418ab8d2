"""What a run shows a researcher: tables, figures, the report's front page, and the run's measured times.

  tables     -- CSV and Markdown tables with their captions;
  figures    -- the paper's figures (PNG and PDF);
  front_page -- the front page of `snakemake --report` (imported when the DAG is parsed: no heavy imports);
  times      -- per-job and per-stage wall time and memory of a run, and the results page
                (`python -m knnlm.report results/<config>`).
"""
