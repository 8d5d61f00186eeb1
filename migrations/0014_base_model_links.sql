-- A pipeline's linked models (Core ML `linkedModel` stages name a compiled model file instead of holding
-- one): for each imported pipeline version, which base model version each linked file name resolved to
-- when it was imported. Workers, export and delivery load the linked model from here; the pipeline's own
-- bytes keep the link exactly as the file had it. A linked base model cannot be deleted while a pipeline
-- links to it.
CREATE TABLE attune_base_model_links (
    model           text    NOT NULL,
    version         integer NOT NULL,
    -- linkedModelFileName as the pipeline stores it, e.g. "DrawingEmbedding.mlmodelc".
    file_name       text    NOT NULL CHECK (file_name <> ''),
    linked_model    text    NOT NULL,
    linked_version  integer NOT NULL,
    PRIMARY KEY (model, version, file_name),
    FOREIGN KEY (model, version) REFERENCES attune_base_models (name, version) ON DELETE CASCADE,
    FOREIGN KEY (linked_model, linked_version) REFERENCES attune_base_models (name, version),
    CHECK ((model, version) <> (linked_model, linked_version))
);

CREATE INDEX attune_base_model_links_target ON attune_base_model_links (linked_model, linked_version);
