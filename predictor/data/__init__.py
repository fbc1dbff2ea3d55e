"""Measurements and what is done with them: the profile dataset (`dataset`, its parquet tables beside this module),
collecting it (`collect`: configurations chosen by `predictor.measure.design`, measured by `predictor.measure`), how
noisy it is (`noise`), judging predictors on it (`evaluate`) and fine-tuning on new measurements (`finetune`). The
device facts and kernel profiles the costs read are files here too (`device_facts.json`, `profiles/`)."""
