"""The τ maths: the drafter's predictions along a completion, the acceptance walks over them
(greedy, and expectations along a sampled path), sampling, the statistics over prompts
(bootstrap intervals, per prompt set) and the decoded samples."""
