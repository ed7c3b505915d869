-- create_all of rlvr/infra/schema.py at commit 9a60920 (sqlite), made by tests/data/make_schema_fixture.py

CREATE TABLE store_meta (
	"key" VARCHAR(64) NOT NULL, 
	value TEXT NOT NULL, 
	PRIMARY KEY ("key")
);

CREATE TABLE jobs (
	id VARCHAR(64) NOT NULL, 
	name VARCHAR NOT NULL, 
	spec_json TEXT NOT NULL, 
	status VARCHAR NOT NULL, 
	created_at DATETIME NOT NULL, 
	started_at DATETIME, 
	finished_at DATETIME, 
	error VARCHAR NOT NULL, 
	adapter_name VARCHAR NOT NULL, 
	adapter_version BIGINT NOT NULL, 
	adapter_path VARCHAR NOT NULL, 
	warnings_json TEXT NOT NULL, 
	worker VARCHAR NOT NULL, 
	current_step INTEGER NOT NULL, 
	total_steps INTEGER NOT NULL, 
	queue_reason TEXT DEFAULT '' NOT NULL, 
	PRIMARY KEY (id)
);

CREATE INDEX ix_jobs_created_at ON jobs (created_at);

CREATE INDEX ix_jobs_status ON jobs (status);

CREATE TABLE training_loops (
	id VARCHAR(64) NOT NULL, 
	name VARCHAR NOT NULL, 
	spec_json TEXT NOT NULL, 
	status VARCHAR NOT NULL, 
	created_at DATETIME NOT NULL, 
	started_at DATETIME, 
	finished_at DATETIME, 
	error VARCHAR NOT NULL, 
	message VARCHAR NOT NULL, 
	warnings_json TEXT NOT NULL, 
	baseline_evaluation_id VARCHAR NOT NULL, 
	baseline_score FLOAT, 
	baseline_questions INTEGER NOT NULL, 
	baseline_seconds FLOAT NOT NULL, 
	evaluation_attempts INTEGER NOT NULL, 
	PRIMARY KEY (id)
);

CREATE INDEX ix_training_loops_created_at ON training_loops (created_at);

CREATE INDEX ix_training_loops_status ON training_loops (status);

CREATE TABLE evaluations (
	id VARCHAR(64) NOT NULL, 
	model VARCHAR NOT NULL, 
	adapter_name VARCHAR NOT NULL, 
	adapter_version BIGINT NOT NULL, 
	benchmark VARCHAR NOT NULL, 
	"limit" INTEGER, 
	seed BIGINT, 
	sampling_json TEXT NOT NULL, 
	status VARCHAR NOT NULL, 
	created_at DATETIME NOT NULL, 
	started_at DATETIME, 
	finished_at DATETIME, 
	error VARCHAR NOT NULL, 
	score FLOAT, 
	accuracy FLOAT, 
	accuracy_strict FLOAT, 
	format FLOAT, 
	answered INTEGER NOT NULL, 
	n_questions INTEGER NOT NULL, 
	n_done INTEGER NOT NULL, 
	score_column VARCHAR NOT NULL, 
	PRIMARY KEY (id)
);

CREATE INDEX ix_evaluations_created_at ON evaluations (created_at);

CREATE INDEX ix_evaluations_status ON evaluations (status);

CREATE TABLE metric_points (
	job_id VARCHAR(64) NOT NULL, 
	step INTEGER NOT NULL, 
	total_steps INTEGER NOT NULL, 
	reward_mean FLOAT NOT NULL, 
	reward_std FLOAT NOT NULL, 
	accuracy FLOAT NOT NULL, 
	format FLOAT NOT NULL, 
	loss FLOAT NOT NULL, 
	kl FLOAT, 
	entropy FLOAT, 
	completion_length_mean FLOAT NOT NULL, 
	completion_length_max INTEGER NOT NULL, 
	clipped_ratio FLOAT NOT NULL, 
	learning_rate FLOAT NOT NULL, 
	adapter_version BIGINT NOT NULL, 
	generate_seconds FLOAT NOT NULL, 
	score_seconds FLOAT NOT NULL, 
	train_seconds FLOAT NOT NULL, 
	sync_seconds FLOAT NOT NULL, 
	step_seconds FLOAT NOT NULL, 
	created_at DATETIME NOT NULL, 
	policy_lag INTEGER DEFAULT '0' NOT NULL, 
	PRIMARY KEY (job_id, step), 
	FOREIGN KEY(job_id) REFERENCES jobs (id) ON DELETE CASCADE
);

CREATE TABLE loop_rounds (
	loop_id VARCHAR(64) NOT NULL, 
	"index" INTEGER NOT NULL, 
	job_id VARCHAR(64), 
	evaluation_id VARCHAR NOT NULL, 
	status VARCHAR NOT NULL, 
	base_round INTEGER NOT NULL, 
	score FLOAT, 
	questions INTEGER NOT NULL, 
	gain_threshold FLOAT NOT NULL, 
	real_gain BOOLEAN NOT NULL, 
	started_at DATETIME, 
	finished_at DATETIME, 
	training_seconds FLOAT NOT NULL, 
	benchmarking_seconds FLOAT NOT NULL, 
	reclaimed_bytes BIGINT NOT NULL, 
	error VARCHAR NOT NULL, 
	PRIMARY KEY (loop_id, "index"), 
	FOREIGN KEY(loop_id) REFERENCES training_loops (id) ON DELETE CASCADE, 
	FOREIGN KEY(job_id) REFERENCES jobs (id) ON DELETE SET NULL
);

CREATE TABLE question_results (
	evaluation_id VARCHAR(64) NOT NULL, 
	"index" INTEGER NOT NULL, 
	prompt TEXT NOT NULL, 
	ground_truth TEXT NOT NULL, 
	completion TEXT NOT NULL, 
	extracted_answer TEXT NOT NULL, 
	reward FLOAT NOT NULL, 
	accuracy FLOAT NOT NULL, 
	format FLOAT NOT NULL, 
	strict BOOLEAN NOT NULL, 
	finish_reason VARCHAR NOT NULL, 
	PRIMARY KEY (evaluation_id, "index"), 
	FOREIGN KEY(evaluation_id) REFERENCES evaluations (id) ON DELETE CASCADE
);

CREATE TABLE artifacts (
	id VARCHAR(64) NOT NULL, 
	job_id VARCHAR(64) NOT NULL, 
	kind VARCHAR NOT NULL, 
	path TEXT NOT NULL, 
	size_bytes BIGINT NOT NULL, 
	created_at DATETIME NOT NULL, 
	PRIMARY KEY (id), 
	FOREIGN KEY(job_id) REFERENCES jobs (id) ON DELETE CASCADE
);

CREATE INDEX ix_artifacts_created_at ON artifacts (created_at);

CREATE INDEX ix_artifacts_job_id ON artifacts (job_id);
