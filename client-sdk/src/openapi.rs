//! OpenAPI schemas (utoipa) of the wire types whose serde form is written by hand: ε, OUE
//! bits, problem types and the validated schema. The derived ones sit on their types behind
//! the `openapi` feature. The aggregator assembles them into its OpenAPI 3.1 document.

use std::borrow::Cow;

use utoipa::openapi::schema::{ArrayBuilder, ObjectBuilder, Schema as OaSchema, Type};
use utoipa::openapi::{KnownFormat, Ref, RefOr, SchemaFormat};
use utoipa::{PartialSchema, ToSchema};

use crate::epsilon::{Epsilon, MAX_EPSILON};
use crate::schema::{Attribute, Schema};
use crate::wire::{OueBits, ProblemType};

impl PartialSchema for Epsilon {
    fn schema() -> RefOr<OaSchema> {
        ObjectBuilder::new()
            .schema_type(Type::Number)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Double)))
            .exclusive_minimum(Some(0.0))
            .maximum(Some(MAX_EPSILON))
            .description(Some(
                "The privacy parameter ε (natural-log units): finite, > 0 and ≤ 20.",
            ))
            .into()
    }
}

impl ToSchema for Epsilon {}

impl PartialSchema for OueBits {
    fn schema() -> RefOr<OaSchema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .pattern(Some("^[A-Za-z0-9_-]*$"))
            .description(Some(
                "An OUE bitset: ⌈k/8⌉ bytes, bit i in byte i/8, least significant bit first; \
                 base64url without padding.",
            ))
            .into()
    }
}

impl ToSchema for OueBits {}

impl PartialSchema for ProblemType {
    fn schema() -> RefOr<OaSchema> {
        let mut description = String::from(
            "The problem type (RFC 9457 `type`), `urn:ldpsyn:problem:<slug>`: the one list \
             shared by the server, the SDK and the WASM client. Types marked client-side are \
             raised by the SDK, never sent by the server.\n\n| type | status | title |\n|---|---|---|\n",
        );
        for t in ProblemType::ALL {
            let client_side = matches!(
                t,
                ProblemType::InvalidRecord
                    | ProblemType::EpsilonTooLarge
                    | ProblemType::BudgetExhausted
            );
            description.push_str(&format!(
                "| `{}` | {} | {}{} |\n",
                t.uri(),
                t.status(),
                t.title(),
                if client_side { " (client-side)" } else { "" }
            ));
        }
        ObjectBuilder::new()
            .schema_type(Type::String)
            .enum_values(Some(ProblemType::ALL.iter().map(|t| t.uri())))
            .description(Some(description))
            .into()
    }
}

impl ToSchema for ProblemType {
    fn name() -> Cow<'static, str> {
        Cow::Borrowed("ProblemType")
    }
}

impl PartialSchema for Schema {
    fn schema() -> RefOr<OaSchema> {
        ObjectBuilder::new()
            .schema_type(Type::Object)
            .property(
                "attributes",
                ArrayBuilder::new()
                    .items(Ref::from_schema_name(Attribute::name()))
                    .min_items(Some(1))
                    .description(Some(
                        "The attributes, in code order: unique non-empty names, domains of \
                         at least two values.",
                    )),
            )
            .required("attributes")
            .additional_properties(Some(
                utoipa::openapi::schema::AdditionalProperties::FreeForm(false),
            ))
            .description(Some(
                "A collection's schema: the attributes every record has (validated on \
                 creation).",
            ))
            .into()
    }
}

impl ToSchema for Schema {
    fn schemas(schemas: &mut Vec<(String, RefOr<OaSchema>)>) {
        schemas.push((Attribute::name().into(), Attribute::schema()));
        <Attribute as ToSchema>::schemas(schemas);
    }
}
